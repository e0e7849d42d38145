"""The SimPy model of an SGLang-like engine: client, scheduler loop, radix KV cache, metrics, sweeps."""
