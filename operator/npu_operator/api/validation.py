"""The checks of a spec that the CRD's schema cannot express, each naming its field.

`validate_spec` finds what the schema lets through but the operator must refuse (for example an
extended resource in the kubernetes.io domain, an extra engine argument that fights a field, a
connector setting that breaks vllm-ascend's rules, a name too long for the names upstream
controllers derive from it); the pod-template policy is `policy`'s.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence
from typing import Final

from npu_runtime.contract import KV_EVENTS_HASH_SEED_ENV, parse_size
from npu_runtime.fetch.listing import REVISION_PATTERN

from npu_operator.api import name_limits, roles
from npu_operator.api.spec import HUB_SOURCE_FIELDS, JSON, POD_MOUNTS, HubSource, NPUInferenceSpec, SpecError

_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_EXTENDED_RESOURCE = re.compile(rf"^(?P<domain>{_DNS_SUBDOMAIN})/(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")

# vLLM flags that a spec field (or the operator) sets; in engine.extraArgs they would override the
# plan, since the extras come last and argparse keeps the last value. Long and short spellings.
FLAGS_OWNED_BY_FIELDS: Final = {
    "--model": "spec.model.path",
    "--served-model-name": "spec.model.name",
    "--host": "(set by the operator)",
    "--port": "(set by the operator)",
    "--config": "the spec (a --config file would override every engine option)",
    "--max-num-seqs": "spec.engine.maxNumSeqs",
    "--max-model-len": "spec.engine.maxModelLen",
    "--gpu-memory-utilization": "spec.engine.gpuMemoryUtilization",
    "--dtype": "spec.engine.dtype",
    "--tensor-parallel-size": "spec.parallelism.tensor",
    "-tp": "spec.parallelism.tensor",
    "--pipeline-parallel-size": "spec.parallelism.pipeline",
    "-pp": "spec.parallelism.pipeline",
    "--data-parallel-size": "spec.parallelism.data",
    "-dp": "spec.parallelism.data",
    "--compilation-config": "spec.graph",
    "-cc": "spec.graph",
    "--optimization-level": "spec.graph",
    "-O": "spec.graph",
    "--cuda-graph-sizes": "spec.graph.captureSizes",
    "--cudagraph-capture-sizes": "spec.graph.captureSizes",
    "--max-cudagraph-capture-size": "spec.graph.maxCaptureSize",
    "--enforce-eager": "spec.graph.mode (NONE)",
    "--speculative-config": "spec.engine.speculative",
    "--max-num-batched-tokens": "spec.engine.maxNumBatchedTokens",
    "--enable-expert-parallel": "spec.parallelism.expert",
    "-ep": "spec.parallelism.expert",
    "--quantization": "spec.engine.quantization",
    "-q": "spec.engine.quantization",
    "--additional-config": "spec.engine.additionalConfig",
    # Multi-node data parallel: derived from spec.npu.nodes and spec.parallelism.data per pod.
    "--data-parallel-size-local": "spec.npu.nodes",
    "-dpl": "spec.npu.nodes",
    "--data-parallel-start-rank": "spec.npu.nodes",
    "-dpr": "spec.npu.nodes",
    "--data-parallel-address": "spec.npu.nodes",
    "-dpa": "spec.npu.nodes",
    "--data-parallel-rpc-port": "spec.npu.nodes",
    "-dpp": "spec.npu.nodes",
    "--headless": "spec.npu.nodes",
    # A disaggregated resource's roles: the connector's settings, rendered per role.
    "--kv-transfer-config": "spec.disaggregation.connector",
    "--kv-connector-extra-config": "spec.disaggregation.connector.extraConfig",
    # LoRA: the limits are planned (their slots come out of the KV cache), the adapters are the list's.
    "--enable-lora": "spec.lora",
    "--max-loras": "spec.lora.maxLoras",
    "--max-lora-rank": "spec.lora.maxLoraRank",
    "--max-cpu-loras": "spec.lora.maxCpuLoras",
    "--fully-sharded-loras": "spec.lora",
    "--lora-modules": "spec.lora.adapters",
}


def engine_flag(arg: str) -> str | None:
    """The option `arg` names, spelled as vLLM's FlexibleArgumentParser reads it; None for a value.

    That parser turns underscores into dashes in a long option's name (up to the first `.`),
    reads `--name.key value` as a JSON field of `--name`, reads `-O3`, `-O=3` and `-Odecode` as
    `--optimization-level`, and, being an argparse parser, accepts `--name=value` and `-xy=value`.
    """
    if arg.startswith("--") and len(arg) > 2:
        name = arg[2:].split("=", 1)[0].split(".", 1)[0]
        return "--" + name.replace("_", "-")
    if arg.startswith("-O"):
        return "-O"
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit() and arg[1] != ".":
        return arg.split("=", 1)[0].split(".", 1)[0]
    return None


def owned_flag(arg: str) -> str | None:
    """The owned flag `arg` sets, in any spelling vLLM accepts, abbreviations included.

    argparse (allow_abbrev, on in vLLM) takes a unique prefix of an option for the option, and
    refuses an ambiguous one: so a prefix of an owned flag is refused too (it is the owned flag,
    or it would fail anyway).
    """
    flag = engine_flag(arg)
    if flag is None or flag in ("-", "--"):
        return None
    if flag == "-O":
        return flag
    if (found := next((owned for owned in FLAGS_OWNED_BY_FIELDS if owned.startswith(flag)), None)) is not None:
        return found
    # A one-letter option with its value attached: argparse reads `-qawq` as `-q awq` when no
    # option starts with `-qawq` (CPython 3.11, Lib/argparse.py, _get_option_tuples).
    if not flag.startswith("--") and len(flag) > 2 and flag[:2] in FLAGS_OWNED_BY_FIELDS:
        return flag[:2]
    return None


# With spec.cacheAwareRouting.kvEvents the runtime writes these (npu_runtime.kv_events): the router and the
# picker rehash and locate blocks by them, so an engine set otherwise would publish events nobody matches.
FLAGS_OWNED_BY_KV_EVENTS: Final = {
    "--enable-prefix-caching": "spec.cacheAwareRouting (prefix caching is on)",
    "--no-enable-prefix-caching": "spec.cacheAwareRouting (prefix caching is on)",
    "--prefix-caching-hash-algo": "spec.cacheAwareRouting.kvEvents (sha256_cbor)",
    "--block-size": "spec.cacheAwareRouting.kvEvents (128, the picker's block size)",
    "--kv-events-config": "spec.cacheAwareRouting.kvEvents",
}


def kv_events_flag(arg: str, kv_events: bool) -> str | None:
    """The flag of FLAGS_OWNED_BY_KV_EVENTS `arg` sets (by a unique prefix too, as argparse reads it); with
    cache-aware routing but no events only turning prefix caching off is one."""
    flag = engine_flag(arg)
    if flag is None or not flag.startswith("--") or len(flag) < 3:
        return None
    owned = FLAGS_OWNED_BY_KV_EVENTS if kv_events else {"--no-enable-prefix-caching": ""}
    return next((name for name in owned if name.startswith(flag)), None)


# Variables the NPU device plugin sets per pod; overriding them breaks device isolation.
ENV_OWNED_BY_DEVICE_PLUGIN: Final = ("ASCEND_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


def extended_resource_problem(name: str) -> str | None:
    """Why `name` cannot be an extended resource name, or None when it can."""
    match = _EXTENDED_RESOURCE.match(name)
    if not match or len(name) > 253 or len(match["name"]) > 63:
        return f"{name!r} is not an extended resource name such as huawei.com/Ascend910 (domain/name)"
    domain = match["domain"]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"{name!r} is in the kubernetes.io domain, which is reserved for native resources"
    if match["name"].startswith("requests."):
        return f"{name!r}: the 'requests.' prefix is reserved for quota"
    return None


def _lora_problems(spec: NPUInferenceSpec) -> list[SpecError]:
    """An adapter's host directory is mounted at its own path (`children.lora`): not where the pod mounts
    something else (two volumes at one mountPath, which the API server refuses for the whole template)."""
    taken = {posixpath.normpath(spec.model.mount_path): "the model", **POD_MOUNTS}
    problems = []
    for index, adapter in enumerate(spec.lora.adapters if spec.lora else ()):
        path = posixpath.normpath(adapter.host_path) if adapter.host_path else None
        if path is not None and path in taken:
            why = f"{adapter.host_path!r} is where the pod mounts {taken[path]}; keep the adapters in a directory apart"
            problems.append(SpecError(f"spec.lora.adapters[{index}].source.hostPath.path", why))
    return problems


def validate_spec(spec: NPUInferenceSpec, name: str | None = None) -> list[SpecError]:
    """What the schema and its CEL rules let through but cannot be served, each naming its field.

    With the resource's `name` (metadata.name), also whether every name derived from it, by our
    children and by the upstream controllers they are handed to, stays valid (`name_limits`)."""
    problems: list[SpecError] = []
    if name is not None:
        problems += name_limits.name_problems(name, spec)
    if spec.npu.resource_name is not None and (why := extended_resource_problem(spec.npu.resource_name)):
        problems.append(SpecError("spec.npu.resourceName", why))
    if spec.model.name.startswith("-"):
        why = f"{spec.model.name!r} would be read as a flag; start it otherwise"
        problems.append(SpecError("spec.model.name", why))
    engine = spec.engine
    problems += _engine_problems("spec.engine", engine.extra_args, engine.env, engine.additional_config)
    problems += _cache_aware_problems(spec, "spec.engine", engine.extra_args, engine.env)
    if spec.disaggregation is not None:
        problems += _disaggregation_problems(spec)
    if spec.autoscaling is not None and not spec.pod_monitor.enabled:
        problems.append(SpecError("spec.metrics.podMonitor.enabled", AUTOSCALING_NEEDS_POD_MONITOR))
    problems += _lora_problems(spec)
    if spec.model.hub is not None and spec.model.cache is None:
        problems.append(SpecError("spec.model.cache", "a huggingFace or modelScope source needs a cache volume"))
    if posixpath.normpath(spec.model.mount_path) in POD_MOUNTS:
        why = (
            f"{spec.model.mount_path!r} is where the pod mounts {POD_MOUNTS[posixpath.normpath(spec.model.mount_path)]}"
        )
        problems.append(SpecError("spec.model.mountPath", f"{why}; mount the model elsewhere"))
    if not _absolute_clean(spec.model.path):
        problems.append(SpecError("spec.model.path", f"{spec.model.path!r} must be an absolute path without '..'"))
    speculative_model = spec.engine.speculative.model if spec.engine.speculative else None
    if speculative_model and not _absolute_clean(speculative_model):
        problems.append(SpecError("spec.engine.speculative.model", "must be an absolute path in the pod without '..'"))
    try:
        parse_size(spec.engine.shm_size)
    except ValueError as exc:
        problems.append(SpecError("spec.engine.shmSize", str(exc)))
    problems += _hub_problems(spec.model.hub)
    return problems


# The ScaledObject's queries select series by `inference_npu_dev_name`, a label only the resource's own
# PodMonitor gives them (podTargetLabels): without it KEDA reads nothing, i.e. 0, and never scales up.
AUTOSCALING_NEEDS_POD_MONITOR: Final = (
    "must be true with spec.autoscaling: its queries read the series that the resource's PodMonitor labels "
    "with inference_npu_dev_name (without it KEDA reads no load and never scales up)"
)

# vllm-ascend's additional config is small (a few options); one argument of the engine's command line.
ADDITIONAL_CONFIG_MAX_BYTES: Final = 16384


def _hub_problems(hub: HubSource | None) -> list[SpecError]:
    if hub is None:
        return []
    field = "spec.model.source." + next(name for name, value in HUB_SOURCE_FIELDS.items() if value == hub.hub)
    problems: list[SpecError] = []
    # The CRD has the same pattern; checked here too, for objects stored before it had one.
    if hub.revision is not None and not re.match(REVISION_PATTERN, hub.revision):
        problems.append(SpecError(f"{field}.revision", f"{hub.revision!r} is not a branch, tag or commit name"))
    plain = hub.endpoint is not None and not hub.endpoint.startswith("https://")
    if hub.token is not None and plain and not hub.send_token_over_http:
        why = (
            f"{hub.endpoint!r} is not https://: the token in tokenSecretRef would travel in clear text;"
            " use https, or set sendTokenOverHTTP: true to accept that"
        )
        problems.append(SpecError(f"{field}.endpoint", why))
    return problems


def _engine_problems(
    prefix: str, extra_args: Sequence[str], env: Sequence[JSON], additional_config: JSON | None
) -> list[SpecError]:
    """One engine's extra arguments, env and additional config under `prefix` (spec.engine, a P/D role)."""
    problems: list[SpecError] = []
    for index, arg in enumerate(extra_args):
        if _positional(extra_args, index):
            why = (
                f"{arg!r} is no option and follows no option that takes it: vLLM would read it as a positional"
                " argument (the model to serve; a headless worker's --model); write options as --name value"
            )
            problems.append(SpecError(f"{prefix}.extraArgs[{index}]", why))
        if (flag := owned_flag(arg)) is not None:
            spelled = "" if arg.split("=", 1)[0] == flag else f"{arg.split('=', 1)[0]!r} is {flag}: "
            why = f"{spelled}{flag} is set from {FLAGS_OWNED_BY_FIELDS[flag]}; set it there instead"
            problems.append(SpecError(f"{prefix}.extraArgs[{index}]", why))
    for index, var in enumerate(env):
        if var["name"] in ENV_OWNED_BY_DEVICE_PLUGIN:
            why = f"{var['name']} is set by the NPU device plugin for the NPUs it allocates"
            problems.append(SpecError(f"{prefix}.env[{index}]", why))
    if additional_config is not None:
        size = len(json.dumps(additional_config, separators=(",", ":")))
        if size > ADDITIONAL_CONFIG_MAX_BYTES:
            why = f"is {size} bytes as JSON, more than {ADDITIONAL_CONFIG_MAX_BYTES} (it is one command-line argument)"
            problems.append(SpecError(f"{prefix}.additionalConfig", why))
    return problems


def _cache_aware_problems(
    spec: NPUInferenceSpec, prefix: str, extra_args: Sequence[str], env: Sequence[JSON]
) -> list[SpecError]:
    """With spec.cacheAwareRouting: no engine without prefix caching (there would be no cache to route to);
    with kvEvents also none with its own hash, block size, events config or PYTHONHASHSEED."""
    if spec.cache_aware_routing is None:
        return []
    problems: list[SpecError] = []
    for index, arg in enumerate(extra_args):
        if (flag := kv_events_flag(arg, spec.kv_events)) is None:
            continue
        if flag == "--no-enable-prefix-caching":
            why = "turns prefix caching off, which spec.cacheAwareRouting routes by; remove it or cacheAwareRouting"
        else:
            why = f"{flag} is set from {FLAGS_OWNED_BY_KV_EVENTS[flag]}; remove it"
        problems.append(SpecError(f"{prefix}.extraArgs[{index}]", why))
    if spec.kv_events:
        for index, var in enumerate(env):
            if var["name"] == KV_EVENTS_HASH_SEED_ENV:
                why = (
                    f"{KV_EVENTS_HASH_SEED_ENV} seeds the engines' block hashes, which "
                    "spec.cacheAwareRouting.kvEvents sets the same on every engine and in the picker; remove it"
                )
                problems.append(SpecError(f"{prefix}.env[{index}]", why))
    return problems


def _disaggregation_problems(spec: NPUInferenceSpec) -> list[SpecError]:
    """The prefill role's extra arguments and env, and the connector's port (vllm-ascend's rules)."""
    assert spec.disaggregation is not None
    prefill = spec.disaggregation.prefill
    problems = _engine_problems(
        "spec.disaggregation.prefill", prefill.extra_args, prefill.env, prefill.additional_config
    )
    problems += _cache_aware_problems(spec, "spec.disaggregation.prefill", prefill.extra_args, prefill.env)
    for setting, why in roles.connector_problems(spec):
        problems.append(SpecError(f"spec.disaggregation.connector.{setting}", why))
    if roles.external_decode(spec):
        problems += _external_rank_problems(spec.engine.extra_args)
    return problems


# With external decode ranks the runtime gives each rank's API server its rank (vLLM's
# --data-parallel-rank, -dpn; --data-parallel-external-lb, -dpe, is implied by it): a user's own
# would come after and replace it on every rank. Each as argparse reads it: a long option by any
# prefix that is its own (`--data-parallel-r` is also --data-parallel-rpc-port's, which
# FLAGS_OWNED_BY_FIELDS has), a short one also with its value attached (`-dpn1`).
_EXTERNAL_RANK_LONG: Final = {
    "--data-parallel-rank": "--data-parallel-ra",
    "--data-parallel-external-lb": "--data-parallel-e",
}
_EXTERNAL_RANK_SHORT: Final = ("-dpn", "-dpe")


def _external_rank_problems(extra_args: Sequence[str]) -> list[SpecError]:
    problems: list[SpecError] = []
    for index, arg in enumerate(extra_args):
        flag = engine_flag(arg)
        if flag is None:
            continue
        long = any(full.startswith(flag) and flag.startswith(least) for full, least in _EXTERNAL_RANK_LONG.items())
        if long or flag.startswith(_EXTERNAL_RANK_SHORT):
            why = (
                f"{arg.split('=', 1)[0]} is set per rank by spec.disaggregation.decode.dataParallel external "
                "(each rank's API server gets its own --data-parallel-rank); remove it"
            )
            problems.append(SpecError(f"spec.engine.extraArgs[{index}]", why))
    return problems


def _positional(args: Sequence[str], index: int) -> bool:
    """Whether args[index] is a positional argument to vLLM's parser: `--` (which ends the options), or
    a value that no option before it takes (the first argument, or one after a value or after
    `--name=value`). An option that takes no value followed by a value is not told apart here (it
    needs the engine's own parser); the engine then refuses the extra positional argument."""
    arg = args[index]
    if arg == "--":
        return True
    if engine_flag(arg) is not None:
        return False
    before = args[index - 1] if index > 0 else None
    return before is None or engine_flag(before) is None or "=" in before


def _absolute_clean(path: str) -> bool:
    return path.startswith("/") and ".." not in path.split("/")
