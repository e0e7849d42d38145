"""Service-rate model, M/G/1 approximation, Theorem 1 check and knee prediction."""
