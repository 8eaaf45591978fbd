"""The command-line contract of `npu-runtime plan` and `npu-runtime serve`.

The operator renders a pod's `args` with `serve_argv`; the runtime parses them with
`serve_parser`. Both sides import this module, so a flag can only be renamed in one
place, and a test parses the operator's rendered args with the runtime's own parser.
Pure: no torch, no vllm, no I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Final


class GraphMode(StrEnum):
    """The graph modes of vLLM's CUDAGraphMode (vllm/config/compilation.py); vllm-ascend uses the same
    enum for its ACL graphs. The one definition of the names: the planner (planner/modes.py), the
    observer and the operator's status take them from here.

    Declared weakest first: how much of the decode step runs as a captured graph. NONE runs every
    step eagerly; PIECEWISE replays the pieces between attention layers; FULL_DECODE_ONLY replays the
    whole decode step (prefill eager); FULL also mixed batches; FULL_AND_PIECEWISE adds piecewise
    graphs for what FULL cannot capture.
    """

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL = "FULL"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


# The mode names as plain strings, weakest first (`GraphMode`'s order).
GRAPH_MODES_WEAKEST_FIRST: Final[tuple[str, ...]] = tuple(mode.value for mode in GraphMode)


def graph_mode_rank(mode: str | None) -> int:
    """The place of `mode` in GRAPH_MODES_WEAKEST_FIRST (higher is stronger); -1 for an unknown or missing mode."""
    return GRAPH_MODES_WEAKEST_FIRST.index(mode) if mode in GRAPH_MODES_WEAKEST_FIRST else -1


# The --graph-mode choices, the default first.
GRAPH_MODES: Final = (
    GraphMode.FULL_DECODE_ONLY.value,
    GraphMode.FULL_AND_PIECEWISE.value,
    GraphMode.FULL.value,
    GraphMode.PIECEWISE.value,
    GraphMode.NONE.value,
)
DEVICE_KINDS: Final = ("npu", "cuda", "cpu")
DEFAULT_GRAPH_MODE: Final = GraphMode.FULL_DECODE_ONLY.value
DEFAULT_MAX_NUM_SEQS: Final = 256  # vLLM's SchedulerConfig default
DEFAULT_GPU_MEMORY_UTILIZATION: Final = 0.9  # vLLM's CacheConfig default
DEFAULT_PORT: Final = 8000
DEFAULT_METRICS_PORT: Final = 9090
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"
# The data-parallel RPC port of vllm-ascend's multi-node DeepSeek tutorial (--data-parallel-rpc-port 13389).
DEFAULT_DATA_PARALLEL_RPC_PORT: Final = 13389
# `serve --data-parallel-external`: one vLLM API server per local data-parallel rank, rank i of the pod
# on --port + i (`external_rank_ports`), as vllm-ascend's P/D tutorial runs decode
# (examples/external_online_dp/launch_online_dp.py: `--port vllm_start_port + i`).
EXTERNAL_DP_FLAG: Final = "--data-parallel-external"
# How long `serve` waits for the engine after forwarding SIGTERM before it kills it. Below
# Kubernetes' default terminationGracePeriodSeconds (30) so the runtime, not the kubelet, ends it.
DEFAULT_SHUTDOWN_TIMEOUT: Final = 25.0
# The engine exits that a failed graph capture ends in (serving/failures.py names them): the
# calibration record keeps one (planner/calibration.py) and `serve` writes it (serving/measured.py).
GRAPH_CAPTURE_OOM: Final = "GraphCaptureOutOfMemory"
CAPTURE_FAILURE_CLASSES: Final = (GRAPH_CAPTURE_OOM, "StreamResourcesExhausted")
# The roles of a prefill/decode pair (kv_transfer.KV_ROLES's keys), as the calibration key names them.
CALIBRATION_ROLES: Final = ("prefill", "decode")

# `serve --kv-events` (spec.cacheAwareRouting.kvEvents): the engine publishes its KV cache events
# (vLLM's --kv-events-config, vllm/config/kv_events.py KVEventsConfig, over ZMQ) for the P/D router
# and the endpoint picker, which subscribe to each pod. The one definition of what both sides must
# agree on (npu_runtime.kv_events renders the engine's flags from them; the operator names the ports
# in the pod, the router's args and the picker's config):
# - the ports: vLLM binds the events' PUB socket at KV_EVENTS_PORT and the replay ROUTER socket at
#   KV_REPLAY_PORT, each plus the engine core's data-parallel rank (vllm/distributed/kv_events.py
#   ZmqEventPublisher.offset_endpoint_port, given ParallelConfig.data_parallel_index, the global DP
#   rank: vllm/v1/core/sched/scheduler.py). The two ranges must not meet: the replay base sits
#   MAX_DATA_PARALLEL (the CRD's maximum of parallelism.data) above the events' base, so that rank
#   r's events never take rank 0's replay port (5557 and 5558 would collide from two ranks on).
# - the block hash: sha256_cbor (vllm/config/cache.py PrefixCachingHashAlgo: "reproducible,
#   cross-language compatible"), seeded by PYTHONHASHSEED (vllm/v1/core/kv_cache_utils.py
#   resolve_none_hash_seed / init_none_hash), which the pod sets to KV_EVENTS_HASH_SEED on every
#   engine and the picker's precise prefix cache producer takes as its tokenProcessorConfig.hashSeed.
# - the block size: KV_EVENTS_BLOCK_SIZE, written as --block-size: vllm-ascend forces 128 with prefix
#   caching on (vllm_ascend/utils.py refresh_block_size, v0.23.0: "Block size is set to 128 if prefix
#   cache or chunked prefill is enabled"), so every engine, NPU or not, hashes the same blocks.
KV_EVENTS_FLAG: Final = "--kv-events"
KV_EVENTS_PORT: Final = 5557
MAX_DATA_PARALLEL: Final = 1024
KV_REPLAY_PORT: Final = KV_EVENTS_PORT + MAX_DATA_PARALLEL
KV_EVENTS_HASH_ALGO: Final = "sha256_cbor"
KV_EVENTS_HASH_SEED: Final = "0"
KV_EVENTS_HASH_SEED_ENV: Final = "PYTHONHASHSEED"  # the variable it is set in
KV_EVENTS_BLOCK_SIZE: Final = 128
# The replay buffer: the steps of events an engine keeps for a subscriber that reconnects (vLLM's
# KVEventsConfig.buffer_steps default).
KV_EVENTS_BUFFER_STEPS: Final = 10_000

# Environment recommended for vLLM-Ascend engines. The operator writes it into the pod spec (so
# `kubectl describe` shows it) and the runtime sets it for the engine where it is unset; a value
# the user sets always wins. Sources: vllm-ascend's docs on performance tuning and graph mode.
ASCEND_RECOMMENDED_ENV: Final = {
    # Lets the caching allocator grow segments instead of fragmenting: fewer OOMs at graph capture.
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    # Dispatches operators through the task queue (level 1), overlapping host and device work.
    "TASK_QUEUE_ENABLE": "1",
    # Expands HCCL collectives on the AI vector cores, which graph mode captures.
    "HCCL_OP_EXPANSION_MODE": "AIV",
}

KIB: Final = 1 << 10
MIB: Final = 1 << 20
GIB: Final = 1 << 30

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B?|[KMGTP]B|B)?\s*$", re.IGNORECASE)
_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": KIB,
    "kib": KIB,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": MIB,
    "mib": MIB,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": GIB,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "ti": 1 << 40,
    "tib": 1 << 40,
    "p": 1000**5,
    "pb": 1000**5,
    "pi": 1 << 50,
    "pib": 1 << 50,
}


class PlanError(ValueError):
    """Invalid input: exit 2, naming `field` as `option_name(field)` shows it (an option or an env variable)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def parse_size(text: str) -> int:
    """Bytes from `64Gi`, `32GiB`, `500M`, `1.5Ti` or a plain number of bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (use bytes or a unit such as 64Gi, 32GiB, 500M)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").lower()])


def format_gib(n: int) -> str:
    """Bytes as plans and messages show them: `68719476736` -> `64.00 GiB`."""
    return f"{n / GIB:.2f} GiB"


def parse_capture_sizes(text: str) -> tuple[int, ...]:
    """`1,2,4,8` -> (1, 2, 4, 8). Order and range are checked by the planner, not here."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"not a comma-separated list of integers: {text!r}") from None


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """What the planner is asked for: the engine settings plus optional device overrides."""

    graph_mode: str = DEFAULT_GRAPH_MODE
    capture_sizes: tuple[int, ...] | None = None
    max_capture_size: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_model_len: int | None = None
    # None: planned (at least vLLM's 2048 and the largest capture size).
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    speculative_method: str | None = None
    speculative_tokens: int = 0
    speculative_model: str | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    # vLLM's --enable-expert-parallel: MoE layers split their experts over the DP x TP ranks (EP)
    # instead of tensor-slicing every expert over them.
    enable_expert_parallel: bool = False
    # Nodes one replica spans; device_count stays devices per node (tensor x pipeline x data =
    # devices per node x nodes). Each node runs data_parallel / nodes whole DP ranks.
    nodes: int = 1
    # vLLM's --quantization; None: detected from the checkpoint ("ascend" for ModelSlim's
    # quant_model_description.json, else the config's quantization_config).
    quantization: str | None = None
    # Off-device planning: each one replaces what the device probe would report.
    device_kind: str | None = None
    device_name: str | None = None
    device_memory: int | None = None
    device_count: int | None = None
    # ACL graph stream cap per device (NPU only); None: the release's (no supported release has one
    # since vllm-ascend removed update_aclgraph_sizes). Our own cap: soft-partitioned NPUs get only a
    # share of the device's streams (vllm-ascend issue #8585).
    stream_budget: int | None = None
    # The vllm-ascend release whose rules the plan follows (planner/releases.py RULES); None: the
    # installed one when the table has it, else the images' default.
    engine_release: str | None = None
    # vllm-ascend's flashcomm1 (additional_config enable_flashcomm1); None: VLLM_ASCEND_ENABLE_FLASHCOMM1.
    flashcomm1: bool | None = None
    # vllm-ascend's enable_fused_mc2 (0, 1, 2); None: VLLM_ASCEND_ENABLE_FUSED_MC2, else 0.
    fused_mc2: int | None = None
    # HCCL_BUFFSIZE (MB) the engine runs with; None: the environment's (the pod's env, which
    # spec.engine.env sets), else HCCL's default 200.
    hccl_buffsize: int | None = None
    # Redundant experts of vllm-ascend's EPLB (additional_config eplb_config.num_redundant_experts);
    # None: read from serve's --additional-config, else 0.
    redundant_experts: int | None = None
    # A calibration record (JSON, written by the operator from an earlier pod's measurements) whose
    # measured figures replace the estimates when its key matches this plan's.
    calibration: str | None = None
    # The prefill/decode role this engine serves (part of the calibration key: a role's record is
    # never another role's); `serve` takes it from --kv-transfer-config. None: no role.
    role: str | None = None
    # LoRA adapters (vLLM's --enable-lora): on when max_loras is set. vLLM preallocates max_loras
    # slots of max_lora_rank for every LoRA-capable layer and captures each graph per LoRA case.
    max_loras: int | None = None
    # None: vLLM's LoRAConfig default (16).
    max_lora_rank: int | None = None
    # Adapters kept in host memory; None: vLLM's default (max_loras).
    max_cpu_loras: int | None = None
    # vLLM's --fully-sharded-loras: the LoRA A of column-parallel layers and B of row-parallel ones
    # are sharded over TP too.
    fully_sharded_loras: bool = False


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """Everything `npu-runtime serve` is started with."""

    model: str
    plan: PlanOptions = PlanOptions()
    served_model_name: str | None = None
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    engine_resolves_mode: bool = False
    termination_log: str = DEFAULT_TERMINATION_LOG
    extra_engine_args: tuple[str, ...] = ()
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    # vllm-ascend's --additional-config, as JSON text; passed to the engine unchanged.
    additional_config: str | None = None
    # vLLM's --kv-transfer-config (a JSON object; see npu_runtime.kv_transfer): this engine is one
    # role of a prefill/decode pair. Passed to the engine, mapped to the device.
    kv_transfer_config: str | None = None
    # Multi-node replicas (plan.nodes > 1): this pod's node (0: the leader, which runs the API
    # server), the leader's address and the data-parallel RPC port, for vLLM's launcher.
    node_rank: int = 0
    data_parallel_address: str | None = None
    data_parallel_rpc_port: int = DEFAULT_DATA_PARALLEL_RPC_PORT
    # External data parallelism: one API server per local data-parallel rank (vLLM's
    # --data-parallel-rank, external load balancing), each on its own port (`external_rank_ports`).
    data_parallel_external: bool = False
    # The adapter list (`serving/adapters.py` reads it: a JSON file the operator's ConfigMap mounts):
    # loaded at start as --lora-modules, and kept in step with the engine while it serves (vLLM's
    # /v1/load_lora_adapter and /v1/unload_lora_adapter). None: no adapters (LoRA may still be on).
    lora_adapters: str | None = None
    # --kv-events: the engine publishes its KV cache events (npu_runtime.kv_events) under this ZMQ topic
    # (llm-d's "kv@<pod address>:<port>@<model>"; the kubelet expands the pod's address). None: no events.
    kv_events_topic: str | None = None


def external_rank_ports(port: int, local_ranks: int) -> tuple[int, ...]:
    """The API ports of a pod's data-parallel ranks with --data-parallel-external: `port` + the rank's
    index on the pod. The one rule, shared by the runtime (which binds them) and the operator (which
    names them in the pod, its Services and the router's URLs)."""
    return tuple(port + local for local in range(local_ranks))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _argtype(parse: Callable[[str], object]) -> Callable[[str], object]:
    """Wrap a ValueError-raising parser so argparse prints its message."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The planner's options, shared by `plan` and `serve`."""
    engine = parser.add_argument_group("engine settings the plan is made for")
    engine.add_argument("--graph-mode", choices=GRAPH_MODES, default=DEFAULT_GRAPH_MODE)
    engine.add_argument(
        "--capture-sizes",
        type=_argtype(parse_capture_sizes),
        default=None,
        help="explicit batch sizes to capture, e.g. 1,2,4,8 (default: planned)",
    )
    engine.add_argument("--max-capture-size", type=_positive_int, default=None)
    engine.add_argument("--max-num-seqs", type=_positive_int, default=DEFAULT_MAX_NUM_SEQS)
    engine.add_argument("--max-model-len", type=_positive_int, default=None)
    engine.add_argument(
        "--max-num-batched-tokens",
        type=_positive_int,
        default=None,
        help="tokens per scheduler step (default: planned, at least 2048 and the largest capture size)",
    )
    engine.add_argument("--gpu-memory-utilization", type=_fraction, default=DEFAULT_GPU_MEMORY_UTILIZATION)
    engine.add_argument("--tensor-parallel", type=_positive_int, default=1)
    engine.add_argument("--pipeline-parallel", type=_positive_int, default=1)
    engine.add_argument("--data-parallel", type=_positive_int, default=1)
    engine.add_argument("--speculative-method", default=None)
    engine.add_argument("--speculative-tokens", type=_non_negative_int, default=0)
    engine.add_argument("--speculative-model", default=None, help="draft or EAGLE head model directory")
    engine.add_argument("--dtype", default="auto")
    engine.add_argument("--enforce-eager", action="store_true")
    engine.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="split MoE experts over the data x tensor parallel ranks (vLLM's --enable-expert-parallel)",
    )
    engine.add_argument(
        "--nodes",
        type=_positive_int,
        default=1,
        help="nodes one replica spans; --device-count stays devices per node",
    )
    engine.add_argument(
        "--quantization",
        default=None,
        help="vLLM's --quantization (default: detected from the model directory, e.g. ascend for ModelSlim)",
    )
    engine.add_argument(
        "--hccl-buffsize",
        type=_positive_int,
        default=None,
        help="HCCL_BUFFSIZE in MB the engine runs with (default: the environment's, else 200)",
    )
    engine.add_argument(
        "--redundant-experts",
        type=_non_negative_int,
        default=None,
        help="EPLB redundant experts (default: additional-config eplb_config.num_redundant_experts, else 0)",
    )
    engine.add_argument(
        "--engine-release",
        default=None,
        help="the vllm-ascend release whose rules to plan for, e.g. 0.23.0 or 0.25.1rc1 "
        "(default: the installed one, else the images' default)",
    )
    engine.add_argument(
        "--flashcomm1",
        action="store_const",
        const=True,
        default=None,
        help="vllm-ascend's flashcomm1 is on (default: additional-config enable_flashcomm1, else "
        "VLLM_ASCEND_ENABLE_FLASHCOMM1)",
    )
    engine.add_argument(
        "--fused-mc2",
        type=int,
        choices=(0, 1, 2),
        default=None,
        help="vllm-ascend's enable_fused_mc2 (default: additional-config, else VLLM_ASCEND_ENABLE_FUSED_MC2, else 0)",
    )
    engine.add_argument(
        "--calibration",
        default=None,
        help="a calibration record (JSON) of measured figures for this model, device and layout",
    )
    engine.add_argument(
        "--role",
        choices=CALIBRATION_ROLES,
        default=None,
        help="the prefill/decode role planned for (part of the calibration key; serve: from --kv-transfer-config)",
    )
    lora = parser.add_argument_group("LoRA adapters (vLLM's --enable-lora; off unless --max-loras is given)")
    lora.add_argument(
        "--max-loras",
        type=_positive_int,
        default=None,
        help="adapters in one batch: LoRA slots preallocated on every device, taken from the KV cache",
    )
    lora.add_argument(
        "--max-lora-rank",
        type=_positive_int,
        default=None,
        help="the largest adapter rank: 1, 8, 16, 32, 64, 128, 256, 320 or 512 (vLLM: 16)",
    )
    lora.add_argument(
        "--max-cpu-loras",
        type=_positive_int,
        default=None,
        help="adapters kept in host memory, >= --max-loras (vLLM: max-loras)",
    )
    lora.add_argument(
        "--fully-sharded-loras",
        action="store_true",
        help="also shard column-parallel LoRA A and row-parallel LoRA B over TP (vLLM's --fully-sharded-loras)",
    )
    device = parser.add_argument_group("device overrides (default: probe the device)")
    device.add_argument("--device-kind", choices=DEVICE_KINDS, default=None)
    device.add_argument("--device-name", default=None)
    device.add_argument("--device-memory", type=_argtype(parse_size), default=None, help="per device")
    device.add_argument("--device-count", type=_positive_int, default=None)
    device.add_argument(
        "--stream-budget",
        type=_positive_int,
        default=None,
        help="cap the ACL graph streams per NPU (default: none; no supported vllm-ascend release enforces a "
        "budget; set one on a shared NPU)",
    )


def plan_options_from_args(args: argparse.Namespace) -> PlanOptions:
    return PlanOptions(**{field.name: getattr(args, field.name) for field in dataclasses.fields(PlanOptions)})


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-runtime serve",
        description="Plan, then start vLLM's OpenAI server with the plan and report what the engine did.",
        epilog="Arguments after `--` go to the engine unchanged.",
    )
    parser.add_argument("--model", required=True, help="model directory inside the pod")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=_positive_int, default=DEFAULT_PORT)
    parser.add_argument("--metrics-port", type=_positive_int, default=DEFAULT_METRICS_PORT)
    parser.add_argument(
        "--engine-resolves-mode",
        action="store_true",
        help="pass the requested graph mode to the engine unchanged (capture sizes are still planned)",
    )
    parser.add_argument("--termination-log", default=DEFAULT_TERMINATION_LOG)
    parser.add_argument(
        "--shutdown-timeout",
        type=_non_negative_float,
        default=DEFAULT_SHUTDOWN_TIMEOUT,
        help="seconds to wait for the engine after SIGTERM before killing it (keep it below the "
        "pod's terminationGracePeriodSeconds)",
    )
    parser.add_argument(
        "--additional-config",
        type=_argtype(_json_object_text),
        default=None,
        help="vllm-ascend's --additional-config (a JSON object), passed to the engine",
    )
    parser.add_argument(
        "--kv-transfer-config",
        type=_argtype(_json_object_text),
        default=None,
        help="vLLM's --kv-transfer-config (a JSON object) of a prefill or decode engine; on a CPU a "
        "Mooncake connector becomes vLLM's file-based ExampleConnector",
    )
    nodes = parser.add_argument_group("multi-node replicas (--nodes > 1)")
    nodes.add_argument("--node-rank", type=_non_negative_int, default=0, help="this pod's node: 0 runs the API server")
    nodes.add_argument("--data-parallel-address", default=None, help="the leader's address (LWS_LEADER_ADDRESS)")
    nodes.add_argument("--data-parallel-rpc-port", type=_positive_int, default=DEFAULT_DATA_PARALLEL_RPC_PORT)
    parser.add_argument(
        EXTERNAL_DP_FLAG,
        dest="data_parallel_external",
        action="store_true",
        help="one vLLM API server per local data-parallel rank (vLLM's --data-parallel-rank), rank i of "
        "this pod on --port + i",
    )
    parser.add_argument(
        "--lora-adapters",
        default=None,
        help="a JSON file listing the LoRA adapters to serve (needs --max-loras); re-read while serving, "
        "adapters added or removed are loaded or unloaded without a restart",
    )
    parser.add_argument(
        KV_EVENTS_FLAG,
        dest="kv_events_topic",
        metavar="TOPIC",
        default=None,
        help=f"publish the engine's KV cache events under TOPIC (ZMQ on {KV_EVENTS_PORT} + DP rank, replay on "
        f"{KV_REPLAY_PORT} + DP rank), with prefix caching, {KV_EVENTS_HASH_ALGO} block hashes and block size "
        f"{KV_EVENTS_BLOCK_SIZE}",
    )
    add_plan_arguments(parser)
    return parser


def _json_object_text(text: str) -> str:
    """`text` unchanged when it is a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return text


def parse_serve_args(argv: Sequence[str]) -> ServeOptions:
    """Parse `serve` flags; everything after the first `--` is an extra engine argument."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = serve_parser().parse_args(argv)
    return ServeOptions(
        model=args.model,
        plan=plan_options_from_args(args),
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        engine_resolves_mode=args.engine_resolves_mode,
        termination_log=args.termination_log,
        extra_engine_args=tuple(extra),
        shutdown_timeout=args.shutdown_timeout,
        additional_config=args.additional_config,
        kv_transfer_config=args.kv_transfer_config,
        node_rank=args.node_rank,
        data_parallel_address=args.data_parallel_address,
        data_parallel_rpc_port=args.data_parallel_rpc_port,
        data_parallel_external=args.data_parallel_external,
        lora_adapters=args.lora_adapters,
        kv_events_topic=args.kv_events_topic,
    )


def option_name(field: str) -> str:
    """The option that carries `field` ("capture_sizes" -> "--capture-sizes").

    Upper-case names are environment variables (a PlanError may name one, e.g.
    ASCEND_LAUNCH_BLOCKING) and stay as they are.
    """
    return field if field.isupper() else "--" + field.replace("_", "-")


# Written only when they differ from the default, so that one-node pods keep the args they had.
_SINGLE_NODE_DEFAULTS: Final = frozenset({"nodes"})


def serve_argv(options: ServeOptions) -> list[str]:
    """The `serve` arguments (without the `npu-runtime serve` prefix) that parse back to `options`.

    Every set value is written out, defaults included, so that `kubectl describe pod` shows the
    settings the runtime was started with.
    """
    argv = ["--model", options.model]
    if options.served_model_name is not None:
        argv += ["--served-model-name", options.served_model_name]
    argv += ["--port", str(options.port), "--metrics-port", str(options.metrics_port)]
    if options.host != ServeOptions.host:
        argv += ["--host", options.host]
    if options.termination_log != DEFAULT_TERMINATION_LOG:
        argv += ["--termination-log", options.termination_log]
    if options.engine_resolves_mode:
        argv.append("--engine-resolves-mode")
    if options.shutdown_timeout != DEFAULT_SHUTDOWN_TIMEOUT:
        argv += ["--shutdown-timeout", f"{options.shutdown_timeout:g}"]
    if options.additional_config is not None:
        argv += ["--additional-config", options.additional_config]
    if options.kv_transfer_config is not None:
        argv += ["--kv-transfer-config", options.kv_transfer_config]
    if options.plan.nodes > 1:
        argv += ["--node-rank", str(options.node_rank)]
        if options.data_parallel_address is not None:
            argv += ["--data-parallel-address", options.data_parallel_address]
        argv += ["--data-parallel-rpc-port", str(options.data_parallel_rpc_port)]
    if options.data_parallel_external:
        argv.append(EXTERNAL_DP_FLAG)
    if options.lora_adapters is not None:
        argv += ["--lora-adapters", options.lora_adapters]
    if options.kv_events_topic is not None:
        argv += [KV_EVENTS_FLAG, options.kv_events_topic]
    argv += plan_argv(options.plan)
    if options.extra_engine_args:
        argv += ["--", *options.extra_engine_args]
    return argv


def plan_argv(plan: PlanOptions) -> list[str]:
    """The planner's flags (shared by `serve` and `plan`) that parse back to `plan`."""
    argv: list[str] = []
    for field in dataclasses.fields(PlanOptions):
        value = getattr(plan, field.name)
        if value is None or value is False or (field.name in _SINGLE_NODE_DEFAULTS and value == field.default):
            continue
        if value is True:
            argv.append(option_name(field.name))
        elif isinstance(value, tuple):
            argv += [option_name(field.name), ",".join(str(v) for v in value)]
        else:
            argv += [option_name(field.name), str(value)]
    return argv
