"""The vLLM command-line arguments that carry a plan's decision."""

from __future__ import annotations

import json
from typing import Any

from npu_runtime.contract import PlanOptions
from npu_runtime.planner import modes
from npu_runtime.planner.fit import MemoryPlan
from npu_runtime.planner.lora import DEFAULT_MAX_LORA_RANK
from npu_runtime.planner.quant_config import ASCEND_QUANTIZATION

__all__ = ["vllm_args"]


def vllm_args(
    options: PlanOptions,
    mode: str,
    chosen: tuple[int, ...],
    memory: MemoryPlan,
    dtype: str,
    max_model_len: int,
    batched_tokens: int,
    quantization: str | None,
) -> tuple[str, ...]:
    """Flags for `python -m vllm.entrypoints.openai.api_server` (names from vllm/engine/arg_utils.py);
    `quantization` is the plan's --quantization (`resolve.resolve_quantization`)."""
    compilation: dict[str, Any] = {"cudagraph_mode": mode}
    if mode != modes.NONE:
        compilation["cudagraph_capture_sizes"] = list(chosen)
    args = [
        "--compilation-config",
        json.dumps(compilation, separators=(",", ":")),
        "--max-num-seqs",
        str(options.max_num_seqs),
        "--max-num-batched-tokens",
        str(batched_tokens),
        "--gpu-memory-utilization",
        f"{memory.engine_gpu_memory_utilization:g}",
        "--tensor-parallel-size",
        str(options.tensor_parallel),
        "--pipeline-parallel-size",
        str(options.pipeline_parallel),
        "--dtype",
        dtype,
    ]
    if options.max_model_len is not None:
        args += ["--max-model-len", str(max_model_len)]
    if options.data_parallel > 1:
        args += ["--data-parallel-size", str(options.data_parallel)]
    if options.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if options.speculative_tokens:
        spec: dict[str, Any] = {
            "method": options.speculative_method,
            "num_speculative_tokens": options.speculative_tokens,
        }
        if options.speculative_model:
            spec["model"] = options.speculative_model  # vllm/config/speculative.py SpeculativeConfig.model
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    args += _lora_args(options)
    if mode == modes.NONE:
        args.append("--enforce-eager")
    if quantization is not None and (options.quantization or quantization == ASCEND_QUANTIZATION):
        # vLLM reads a config's quantization_config itself; ModelSlim checkpoints are named, as
        # vllm-ascend's tutorials do (--quantization ascend).
        args += ["--quantization", quantization]
    return tuple(args)


def _lora_args(options: PlanOptions) -> list[str]:
    """vLLM's LoRA flags (vllm/engine/arg_utils.py EngineArgs.add_cli_args, the LoRAConfig group):
    --enable-lora turns it on; --max-lora-rank is always written so the engine allocates what the
    plan counted (vllm/config/lora.py LoRAConfig.max_lora_rank defaults to 16)."""
    if options.max_loras is None:
        return []
    rank = options.max_lora_rank if options.max_lora_rank is not None else DEFAULT_MAX_LORA_RANK
    args = ["--enable-lora", "--max-loras", str(options.max_loras), "--max-lora-rank", str(rank)]
    if options.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(options.max_cpu_loras)]
    if options.fully_sharded_loras:
        args.append("--fully-sharded-loras")
    return args
