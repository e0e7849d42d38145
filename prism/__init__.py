"""PRISM: query-aware scheduling and demand-aware KV eviction for LLM serving with prefix reuse."""

__version__ = "0.1.0"
