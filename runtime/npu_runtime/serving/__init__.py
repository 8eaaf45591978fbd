"""Serving: `npu-runtime serve` starts vLLM with the plan, supervises it and reports (/metrics, /status).

A multi-node worker runs `headless`; `failures` classifies why an engine stopped.
"""
