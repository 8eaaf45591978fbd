"""The planner: the device probe, the model's shape, graph-mode rules, capture sizes and the plan.

Everything here but `probe` is pure; `probe` imports torch / torch_npu only inside functions.
"""
