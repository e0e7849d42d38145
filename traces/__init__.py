"""Trace specs, generators, loaders and the materialized trace format."""

from prism.traces.spec import load_trace
from prism.traces.trace import Trace

__all__ = ["load_trace", "Trace"]
