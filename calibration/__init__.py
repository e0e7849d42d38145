"""Hardware and model profiles, the step-time cost model, and fitting it to measurements."""
