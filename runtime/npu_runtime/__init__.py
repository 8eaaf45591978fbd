"""The pod runtime: plan graph capture for the device, start vLLM with the plan, report what it did.

Importable without torch, torch_npu or vllm: only `probe` and `observer` touch them, and only
inside functions.
"""
