"""SGLang adapters for prism's policies (needs the ``live`` extra: sglang and torch)."""
