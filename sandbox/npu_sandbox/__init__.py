"""The local sandbox: the whole chain (API, operator, runtime, vLLM on CPU) on one machine, no cluster."""
