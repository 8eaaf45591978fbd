"""Input validation: `PlanError` for options, devices and models that vLLM or vllm-ascend would refuse."""

from __future__ import annotations

from npu_runtime.contract import DEVICE_KINDS, GRAPH_MODES, PlanError, PlanOptions
from npu_runtime.planner import modes
from npu_runtime.planner.model import ModelInfo
from npu_runtime.planner.probe import DeviceInfo
from npu_runtime.planner.quant_config import MODELSLIM_DESCRIPTION

__all__ = ["validate"]


def validate(
    options: PlanOptions, device: DeviceInfo, model: ModelInfo, family: str, dtype: str, env: dict[str, str]
) -> None:
    """Raise PlanError for invalid input; `dtype` is the resolved one (`resolve_dtype`)."""
    _validate_values(options, device)
    _validate_parallelism(options, device)
    _validate_model_split(options, model)
    _validate_engine_support(options, device, model, family, dtype, env)


def _validate_values(options: PlanOptions, device: DeviceInfo) -> None:
    """Each option's own range: known names, positive counts, speculative tokens with their method."""
    if options.graph_mode not in GRAPH_MODES:
        raise PlanError("graph_mode", f"{options.graph_mode!r} is not one of {', '.join(GRAPH_MODES)}")
    if device.kind not in DEVICE_KINDS:
        raise PlanError("device_kind", f"{device.kind!r} is not one of {', '.join(DEVICE_KINDS)}")
    for field in ("max_num_seqs", "tensor_parallel", "pipeline_parallel", "data_parallel", "nodes"):
        if getattr(options, field) < 1:
            raise PlanError(field, f"must be a positive integer, got {getattr(options, field)}")
    if options.max_capture_size is not None and options.max_capture_size < 1:
        raise PlanError("max_capture_size", f"must be a positive integer, got {options.max_capture_size}")
    if options.max_model_len is not None and options.max_model_len < 1:
        raise PlanError("max_model_len", f"must be a positive integer, got {options.max_model_len}")
    if not 0.0 < options.gpu_memory_utilization <= 1.0:
        raise PlanError("gpu_memory_utilization", f"must be in (0, 1], got {options.gpu_memory_utilization}")
    if options.stream_budget is not None and options.stream_budget < 1:
        raise PlanError("stream_budget", f"must be a positive integer, got {options.stream_budget}")
    if options.speculative_tokens < 0:
        raise PlanError("speculative_tokens", f"must be zero or more, got {options.speculative_tokens}")
    if options.speculative_tokens and not options.speculative_method:
        raise PlanError("speculative_method", "speculative tokens are set but no speculative method (e.g. mtp, ngram)")
    if options.speculative_method and not options.speculative_tokens:
        raise PlanError("speculative_tokens", f"speculative method {options.speculative_method!r} needs a token count")
    if device.total_bytes < 1:
        raise PlanError("device_memory", f"must be positive, got {device.total_bytes}")


def _validate_parallelism(options: PlanOptions, device: DeviceInfo) -> None:
    """TP x PP x DP against the devices: whole DP ranks per node, no more devices than are visible."""
    world = options.tensor_parallel * options.pipeline_parallel * options.data_parallel
    if options.nodes > 1:
        # vLLM's multi-node data parallel launcher (--data-parallel-size-local, --headless): every
        # node runs whole DP ranks, so a DP rank's TP x PP devices never span nodes.
        if options.data_parallel % options.nodes:
            raise PlanError(
                "data_parallel",
                f"{options.data_parallel} data-parallel ranks cannot be split evenly over {options.nodes} nodes; "
                "each node runs whole ranks (--data-parallel-size-local)",
            )
        if device.kind != "cpu" and options.tensor_parallel * options.pipeline_parallel > device.count:
            raise PlanError(
                "tensor_parallel",
                f"tensor {options.tensor_parallel} x pipeline {options.pipeline_parallel} spans more than one "
                f"node's {device.count} devices; across nodes use data parallel ranks",
            )
    if device.kind != "cpu" and world > device.count * options.nodes:
        raise PlanError(
            "tensor_parallel",
            f"tensor {options.tensor_parallel} x pipeline {options.pipeline_parallel} x data "
            f"{options.data_parallel} = {world} devices, but {device.count} are visible"
            + (f" on each of {options.nodes} nodes" if options.nodes > 1 else ""),
        )


def _validate_model_split(options: PlanOptions, model: ModelInfo) -> None:
    """The model against the layout: heads over TP, layers over PP, MLA's kv_b_proj unquantized."""
    # vllm/config/parallel.py / model.py verify_with_parallel_config: heads must split evenly.
    if model.num_attention_heads % options.tensor_parallel:
        raise PlanError(
            "tensor_parallel",
            f"{model.num_attention_heads} attention heads cannot be split over {options.tensor_parallel} ranks",
        )
    if options.pipeline_parallel > model.num_layers:
        raise PlanError("pipeline_parallel", f"{options.pipeline_parallel} stages for {model.num_layers} layers")
    if model.is_mla and model.quantized_kv_b_proj:
        # vllm_ascend/attention/mla_v1.py process_weights_after_loading: "We currently do not
        # support quant kv_b_proj" (asserts an UnquantizedLinearMethod); the engine would fail after
        # loading every weight.
        raise PlanError(
            "quantization",
            f"{MODELSLIM_DESCRIPTION} quantizes {model.quantized_kv_b_proj}; vllm-ascend's MLA attention needs "
            "kv_b_proj unquantized (FLOAT): fix the description or requantize without it",
        )


def _validate_engine_support(
    options: PlanOptions, device: DeviceInfo, model: ModelInfo, family: str, dtype: str, env: dict[str, str]
) -> None:
    """What the engine refuses: HCCL buffer and redundant experts out of range, 310P's limits, ACL graphs
    under ASCEND_LAUNCH_BLOCKING."""
    for field in ("hccl_buffsize", "redundant_experts"):
        value = getattr(options, field)
        if value is not None and value < (1 if field == "hccl_buffsize" else 0):
            raise PlanError(field, f"must be a {'positive' if field == 'hccl_buffsize' else 'non-negative'} integer")
    if family == "310P" and model.is_mla:
        # vllm_ascend/_310p/model_runner_310p.py initialize_kv_cache_tensors:
        # "MLAAttention is not supported for 310P."
        raise PlanError("model", f"{model.architecture} uses MLA attention, which vllm-ascend does not support on 310P")
    if family == "310P" and dtype == "bfloat16":
        # vllm-ascend tutorials (Qwen3.5-27B, PaddleOCR-VL): "On Atlas 300I DUO, only float16 is supported."
        raise PlanError("dtype", "310P supports float16 only, not bfloat16")
    if (
        device.kind == "npu"
        and env.get("ASCEND_LAUNCH_BLOCKING", "0") == "1"
        and options.graph_mode != modes.NONE
        and not options.enforce_eager
    ):
        # vllm_ascend/platform.py _setup_compile_backend raises:
        # "ACL graph is incompatible with ASCEND_LAUNCH_BLOCKING=1".
        raise PlanError("ASCEND_LAUNCH_BLOCKING", "ACL graphs are incompatible with ASCEND_LAUNCH_BLOCKING=1; unset it")
