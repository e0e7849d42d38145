"""SGLang adapters for PRISM's policies (the live issue)."""
