"""What each observer hook patches and reads in the engine: one table, held to three uses.

- The hooks (`config_hooks`, `graph_wrappers`, `decode_steps`, `runner_hooks`, `graph_manager`,
  installed by `vllm_hooks`) bind from it: at patch time every parameter a hook reads is looked up
  by name in the target's signature (`inspect.signature`) and must sit where the hook was written
  to expect it; otherwise the hook refuses to install and is reported unavailable with the name
  (`bind`). Attributes read on the hooked object itself are checked at its first call.
- The compatibility tier (tests/compat) resolves every target, parameter and attribute against
  each supported engine release's published source, by AST, with the same `check_parameters`.
- `npu-runtime doctor` binds them against the engine installed in the image.

A parameter that moved is refused, not re-read at its new position: a signature that changed is
a method whose meaning may have changed, and a hook that reads a wrong value makes metrics lie
with no error at all. Optional parameters (and attributes) are read with a default where a
release lacks them; if a release has them elsewhere, they are refused all the same.

Pure data and `inspect`; no engine imports.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class Param:
    """A parameter a hook reads from its target's call."""

    name: str
    index: int | None  # its position after `self`; None: read by keyword only
    optional: bool = False  # a release without it is fine (the hook uses a default)


@dataclass(frozen=True)
class Read:
    """An attribute a hook reads on an engine object, or (class_name None) a module-level name it calls."""

    module: str
    class_name: str | None
    name: str
    optional: bool = False  # read with a default (getattr); a release without it loses detail only


@dataclass(frozen=True)
class Target:
    """One method a hook wraps."""

    hook: str  # the hook's name: the `hook` label of npu_graph_instrumentation_errors_total
    module: str
    class_name: str
    method: str
    params: tuple[Param, ...] = ()
    reads: tuple[Read, ...] = ()
    may_be_absent: bool = False  # a release may lack it (the hook works through its other targets)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.class_name}.{self.method}"

    @property
    def engine(self) -> str:
        """The import package it lives in: vllm or vllm_ascend."""
        return self.module.split(".", 1)[0]

    @property
    def self_attributes(self) -> tuple[str, ...]:
        """Required attributes read on the hooked object itself (checked at its first call)."""
        return tuple(
            read.name
            for read in self.reads
            if not read.optional and (read.module, read.class_name) == (self.module, self.class_name)
        )


class BindError(Exception):
    """The target does not have what the hook reads, where the hook reads it."""


def check_parameters(positional: Sequence[str], keyword_only: Sequence[str], params: Sequence[Param]) -> str | None:
    """Why `params` cannot be bound to a signature (names after `self`), or None when they can."""
    for param in params:
        if param.name in positional:
            index = positional.index(param.name)
            if param.index is not None and index != param.index:
                return f"parameter {param.name} moved (position {index}, the hook expects {param.index})"
        elif param.name in keyword_only:
            if param.index is not None:
                return f"parameter {param.name} became keyword-only (the hook expects position {param.index})"
        elif not param.optional:
            return f"parameter {param.name} missing"
    return None


def signature_names(function: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """(positional names after self, keyword-only names) of a method."""
    parameters = list(inspect.signature(function).parameters.values())
    positional = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    keyword_only = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return positional[1:], keyword_only


class Binding:
    """Where each parameter of a bound target is found in a call: by keyword, else at its verified position."""

    __slots__ = ("_positions",)

    def __init__(self, positions: dict[str, int | None]) -> None:
        self._positions = positions

    def get(self, args: Sequence[Any], kwargs: dict[str, Any], name: str, default: Any = None) -> Any:
        if name in kwargs:
            return kwargs[name]
        index = self._positions[name]  # KeyError: a name the target table does not list (our bug)
        if index is not None and index < len(args):
            return args[index]
        return default


def bind(function: Callable[..., Any], params: Sequence[Param]) -> Binding:
    """Bind `params` to `function`'s signature, or raise BindError naming what is missing or moved."""
    try:
        positional, keyword_only = signature_names(function)
    except (TypeError, ValueError) as exc:
        raise BindError(f"no signature ({exc})") from exc
    problem = check_parameters(positional, keyword_only, params)
    if problem is not None:
        raise BindError(problem)
    return Binding({param.name: positional.index(param.name) if param.name in positional else None for param in params})


def missing_attributes(obj: Any, names: Sequence[str]) -> list[str]:
    """The names in `names` that `obj` lacks (the first-use check of a hook's attributes).

    Any exception from the lookup counts as missing, not only AttributeError: an engine object's
    own `__getattr__` may raise anything (vLLM's CUDAGraphWrapper recurses on a half-built
    instance), and a check inside the engine's call path must never raise into it.
    """
    return [name for name in names if not _has_attribute(obj, name)]


def _has_attribute(obj: Any, name: str) -> bool:
    try:
        getattr(obj, name)
    except Exception:
        return False
    return True


# ----- the table -----

CONFIG: Final = "vllm.config"
FORWARD_CONTEXT: Final = "vllm.forward_context"
CUDA_GRAPH: Final = "vllm.compilation.cuda_graph"
ACL_GRAPH: Final = "vllm_ascend.compilation.acl_graph"
GRAPH_MANAGER: Final = "vllm.v1.worker.gpu.cudagraph_utils"
KV_CACHE_INTERFACE: Final = "vllm.v1.kv_cache_interface"
OUTPUT_PROCESSOR: Final = "vllm.v1.engine.output_processor"
ENGINE_REQUEST: Final = "vllm.v1.engine"
LORA_REQUEST: Final = "vllm.lora.request"

# (module, class) of the model runners: vLLM's V1 and V2 runners, and vllm-ascend's (which
# override most methods). The V1 GPU runner is the one every release must have.
V1_RUNNER: Final = ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
RUNNER_CLASSES: Final = (
    V1_RUNNER,
    ("vllm_ascend.worker.model_runner_v1", "NPUModelRunner"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
    ("vllm_ascend.worker.v2.model_runner", "NPUModelRunner"),
    ("vllm_ascend._310p.model_runner_310p", "NPUModelRunner310"),  # 310P images; calls its base's methods
)

_FORWARD_CONTEXT_READS: Final = (
    Read(FORWARD_CONTEXT, None, "get_forward_context"),
    Read(FORWARD_CONTEXT, None, "is_forward_context_available", optional=True),
    Read(FORWARD_CONTEXT, "ForwardContext", "cudagraph_runtime_mode"),
    Read(FORWARD_CONTEXT, "ForwardContext", "batch_descriptor"),
    Read(FORWARD_CONTEXT, "BatchDescriptor", "num_tokens"),
    Read(CONFIG, "CUDAGraphMode", "NONE"),
    Read(CONFIG, "CUDAGraphMode", "FULL"),
)


def _graph_wrapper(hook: str, module: str, class_name: str, entries: str, entry_class: str, graph: str) -> Target:
    return Target(
        hook,
        module,
        class_name,
        "__call__",
        reads=(
            Read(module, class_name, "runtime_mode"),
            Read(module, class_name, entries),
            Read(module, entry_class, graph),
            *_FORWARD_CONTEXT_READS,
        ),
    )


CUDA_GRAPH_WRAPPER: Final = _graph_wrapper(
    "cuda_graph_wrapper", CUDA_GRAPH, "CUDAGraphWrapper", "concrete_cudagraph_entries", "CUDAGraphEntry", "cudagraph"
)
ACL_GRAPH_WRAPPER: Final = _graph_wrapper(
    "acl_graph_wrapper", ACL_GRAPH, "ACLGraphWrapper", "concrete_aclgraph_entries", "ACLGraphEntry", "aclgraph"
)


def _runner_targets(module: str, class_name: str) -> tuple[Target, ...]:
    # Only the V1 GPU runner must define every method; the others override some (an inherited
    # method is hooked on its base) and vLLM's V2 runner has no batch dispatch of this shape.
    absent_ok = (module, class_name) != V1_RUNNER
    runner = (module, class_name)
    return (
        Target(
            "batch_dispatch",
            *runner,
            "_determine_batch_execution_and_padding",
            params=(
                Param("num_tokens", 0),
                Param("num_reqs", 1),
                Param("max_num_scheduled_tokens", 3),
                Param("use_cascade_attn", 4),
                Param("force_eager", 6, optional=True),
                Param("force_uniform_decode", 7, optional=True),
            ),
            reads=(
                Read(*runner, "compilation_config"),
                Read(*runner, "uniform_decode_query_len", optional=True),
                Read(*runner, "cudagraph_dispatcher", optional=True),
                Read(CONFIG, "CompilationConfig", "cudagraph_mode"),
                Read(CONFIG, "CompilationConfig", "max_cudagraph_capture_size", optional=True),
                Read(CONFIG, "CompilationConfig", "cudagraph_capture_sizes", optional=True),
            ),
            may_be_absent=absent_ok,
        ),
        Target("dummy_run", *runner, "_dummy_run", may_be_absent=absent_ok),
        Target(
            "capture_model",
            *runner,
            "capture_model",
            params=(Param("profile_only", None, optional=True),),
            reads=(Read(*runner, "device", optional=True),),
            may_be_absent=absent_ok,
        ),
        Target(
            "load_model",
            *runner,
            "load_model",
            reads=(Read(*runner, "model_memory_usage", optional=True), Read(*runner, "device", optional=True)),
            may_be_absent=absent_ok,
        ),
        Target(
            "initialize_kv_cache",
            *runner,
            "initialize_kv_cache",
            params=(Param("kv_cache_config", 0), Param("is_profiling", 1, optional=True)),
            reads=(
                Read(KV_CACHE_INTERFACE, "KVCacheConfig", "kv_cache_tensors"),
                Read(KV_CACHE_INTERFACE, "KVCacheTensor", "size"),
            ),
            may_be_absent=absent_ok,
        ),
    )


_DESCRIPTOR_READS: Final = (
    Read(GRAPH_MANAGER, "BatchExecutionDescriptor", "cg_mode"),
    Read(GRAPH_MANAGER, "BatchExecutionDescriptor", "num_tokens"),
)

# issue 47: requests per LoRA adapter, in the frontend (API server) process (observer/lora_requests.py).
LORA_REQUESTS_TARGET: Final = Target(
    "lora_requests",
    OUTPUT_PROCESSOR,
    "OutputProcessor",
    "add_request",
    params=(Param("request", 0),),
    reads=(
        Read(OUTPUT_PROCESSOR, "OutputProcessor", "request_states"),
        Read(ENGINE_REQUEST, "EngineCoreRequest", "request_id"),
        Read(ENGINE_REQUEST, "EngineCoreRequest", "lora_request"),
        Read(LORA_REQUEST, "LoRARequest", "lora_name"),
    ),
)

TARGETS: Final[tuple[Target, ...]] = (
    Target(
        "config_post_init",
        CONFIG,
        "VllmConfig",
        "__post_init__",
        reads=(
            Read(CONFIG, "VllmConfig", "compilation_config"),
            Read(CONFIG, "VllmConfig", "model_config"),
            Read(CONFIG, "CompilationConfig", "cudagraph_mode"),
            Read(CONFIG, "ModelConfig", "enforce_eager", optional=True),
            Read(CONFIG, "ModelConfig", "pooler_config", optional=True),
            Read(CONFIG, "ModelConfig", "is_encoder_decoder", optional=True),
        ),
    ),
    Target(
        "resolve_mode",
        CONFIG,
        "CompilationConfig",
        "resolve_cudagraph_mode_and_sizes",
        params=(
            Param("min_cg_support", 0),
            Param("min_cg_attn_backend", 1),
            Param("piecewise_capture_available", 8, optional=True),
        ),
        reads=(Read(CONFIG, "CompilationConfig", "cudagraph_mode"),),
    ),
    CUDA_GRAPH_WRAPPER,
    ACL_GRAPH_WRAPPER,
    *(target for module, class_name in RUNNER_CLASSES for target in _runner_targets(module, class_name)),
    # Model runner v2's graph manager (vLLM only; a release without it runs the V1 runner).
    Target(
        "graph_manager_capture",
        GRAPH_MANAGER,
        "CudaGraphManager",
        "capture",
        params=(Param("create_forward_fn", 0),),
        reads=_DESCRIPTOR_READS,
        may_be_absent=True,
    ),
    Target(
        "graph_manager_replay",
        GRAPH_MANAGER,
        "CudaGraphManager",
        "run_fullgraph",
        params=(Param("desc", 0),),
        reads=_DESCRIPTOR_READS,
        may_be_absent=True,
    ),
    Target(
        "graph_manager_dispatch",
        GRAPH_MANAGER,
        "CudaGraphManager",
        "dispatch",
        params=(Param("num_tokens", 1), Param("uniform_token_count", 2)),
        reads=(
            Read(GRAPH_MANAGER, "CudaGraphManager", "_graphs_captured"),
            Read(GRAPH_MANAGER, "CudaGraphManager", "captured_token_counts", optional=True),
            *_DESCRIPTOR_READS,
        ),
        may_be_absent=True,
    ),
    LORA_REQUESTS_TARGET,
)


HOOKS: Final[tuple[str, ...]] = tuple(dict.fromkeys(target.hook for target in TARGETS))


def target(hook: str, module: str, class_name: str, method: str) -> Target:
    """The table's entry for one patch site (KeyError-like ValueError when the table lacks it)."""
    for entry in TARGETS:
        if (entry.hook, entry.module, entry.class_name, entry.method) == (hook, module, class_name, method):
            return entry
    raise ValueError(f"no target {hook} {module}.{class_name}.{method} in the table")


def for_class(module: str, class_name: str) -> tuple[Target, ...]:
    return tuple(entry for entry in TARGETS if (entry.module, entry.class_name) == (module, class_name))
