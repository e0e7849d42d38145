"""Scheduling, eviction and routing policies: engine-agnostic (no SimPy, no SGLang)."""
