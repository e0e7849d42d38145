"""PRISM: query-aware scheduling and demand-aware KV eviction for LLM serving with prefix reuse."""

from prism import native as _native

__version__ = "0.1.0"

_native.guard()  # before any compiled module is imported: they may have to come from source (prism/native.py)
