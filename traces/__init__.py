"""Trace specs, generators, loaders and the materialized trace format."""

from prism.traces.spec import load_trace  # noqa: F401
from prism.traces.trace import Trace  # noqa: F401
