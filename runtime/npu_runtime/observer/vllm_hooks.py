"""The hooks on vLLM's and vllm-ascend's classes. Every module, class and method is feature-detected.

What each hook patches and reads is the table in `targets`: parameters are bound by name from the
target's signature when it is patched, and a hook whose parameters are missing or moved refuses to
install (listed as unavailable with the name, counted in npu_graph_instrumentation_errors_total);
attributes read on the hooked object are checked at its first call. The table is checked against
every release in `npu_runtime.engines.RELEASES` by tests/compat (docs/serve.md shows the matrix);
what a release lacks is simply not hooked and is listed as unavailable. Engine-stage reason codes
reuse the planner's (npu_runtime.planner.modes) where the cause is the same, so a dashboard can put the
predicted and the observed downgrade side by side.

Hooks (the name is the `hook` label of npu_graph_instrumentation_errors_total), by module:

- `config_hooks` (every release): config_post_init, VllmConfig.__post_init__ (API server).
  Requested vs final cudagraph_mode; a change is a downgrade at stage engine, with a reason derived
  from the config and platform. resolve_mode, CompilationConfig.resolve_cudagraph_mode_and_sizes
  (workers). The mode the worker really runs; a change is a downgrade with the attention backend
  and its support level.
- `graph_wrappers`: cuda_graph_wrapper / acl_graph_wrapper, vLLM's CUDAGraphWrapper.__call__ and
  vllm-ascend's ACLGraphWrapper.__call__. Capture memory and time per (mode, size); FULL replays
  counted and timed with device events.
- `graph_manager` (vLLM's model runner v2): graph_manager_capture / graph_manager_replay /
  graph_manager_dispatch, CudaGraphManager.capture, run_fullgraph and dispatch (the model's
  manager, not drafters').
- `decode_steps` (V1 runners): batch_dispatch, _determine_batch_execution_and_padding. Decode
  steps, their batch sizes in tokens before padding (`batches`), and eager fallbacks (uniform
  decode batches dispatched to no graph while graphs are on). dummy_run, _dummy_run, so warmup,
  profiling and capture runs are not counted.
- `runner_hooks` (every runner): capture_model, runners' capture_model. Phase capturing/captured,
  graph memory, device memory. load_model, initialize_kv_cache: weights and KV cache memory.
- `lora_requests` (issue 47): lora_requests, OutputProcessor.add_request (API server). Requests per
  LoRA adapter, which vLLM's own counters do not split.
- `dp_load`: dp_load_metrics, no patch; a collector in the API server's Prometheus registry that
  serves the npu_engine_* series, vLLM's per-rank load summed over the ranks.

This module only arranges them (`install`); `process_observer.Observer` holds their state.
"""

from __future__ import annotations

import functools

from npu_runtime.observer import dp_load, targets
from npu_runtime.observer.config_hooks import patch_config
from npu_runtime.observer.graph_manager import patch_graph_manager
from npu_runtime.observer.graph_wrappers import GRAPH_WRAPPERS, patch_graph_wrapper
from npu_runtime.observer.hooks import when_imported
from npu_runtime.observer.lora_requests import patch_output_processor
from npu_runtime.observer.process_observer import Observer
from npu_runtime.observer.runner_hooks import patch_runner


def install(observer: Observer) -> None:
    """Arrange every hook: now for modules already imported, on import for the others."""
    when_imported("vllm.config", functools.partial(patch_config, observer))
    for wrapper in GRAPH_WRAPPERS:
        when_imported(wrapper.module, functools.partial(patch_graph_wrapper, observer, wrapper=wrapper))
    for module_name, class_name in targets.RUNNER_CLASSES:
        when_imported(module_name, functools.partial(patch_runner, observer, class_name=class_name))
    when_imported("vllm.v1.worker.gpu.cudagraph_utils", functools.partial(patch_graph_manager, observer))
    when_imported(targets.OUTPUT_PROCESSOR, functools.partial(patch_output_processor, observer))
    # Not a patch: a collector in vLLM's Prometheus registry, in the process that serves it (dp_load).
    when_imported(dp_load.LOGGERS_MODULE, functools.partial(dp_load.on_import, observer))
