"""The roles of a disaggregated resource, derived from its spec: what each role is planned and
configured from, and the connector's rules both roles must keep. Pure.

The resource's own workload fields describe the decode role; `spec.disaggregation.prefill` adds a
prefill role (`role_spec`). Both roles get the same connector settings (`kv_transfer`), whose rules
are vllm-ascend's (`npu_runtime.kv_transfer.problems`); `validation` refuses a spec that breaks one.
The decode role's data-parallel ranks run behind one API server per replica or one per rank
(`spec.disaggregation.decode.dataParallel`, `external_decode`, `decode_rank_ports`).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from npu_runtime.contract import external_rank_ports
from npu_runtime.kv_transfer import KVTransfer, RoleSizes, problems, reserved_port_floor

from npu_operator.api.spec import NPUInferenceSpec

ROLES: Final = ("prefill", "decode")
# The kubelet expands $(POD_NAME) in the connector's engine_id: a name unique per pod.
POD_NAME_ENV: Final = "POD_NAME"


def role_spec(spec: NPUInferenceSpec, role: str) -> NPUInferenceSpec:
    """The spec one role's engines are built and planned from.

    decode: the resource's own workload fields. prefill: its own replicas, NPUs, parallelism,
    graph mode and engine settings; the model, image, dtype, quantization and maxModelLen are the
    decode role's, so the two cannot disagree. With speculative decoding the prefill role proposes
    one token (vllm-ascend's P/D tutorial: "num_speculative_tokens on P nodes should be 1").
    """
    decode = dataclasses.replace(spec, disaggregation=None)
    if role == "decode":
        return decode
    assert spec.disaggregation is not None and role == "prefill", role
    prefill = spec.disaggregation.prefill
    speculative = spec.engine.speculative
    return dataclasses.replace(
        decode,
        # The DisaggregatedSet rolls out all roles or none: scaled to zero, both roles are.
        replicas=prefill.replicas if spec.replicas > 0 else 0,
        npu=dataclasses.replace(spec.npu, count=prefill.npu_count, nodes=prefill.nodes),
        parallelism=prefill.parallelism,
        graph=dataclasses.replace(spec.graph, mode=prefill.graph_mode, capture_sizes=None, max_capture_size=None),
        engine=dataclasses.replace(
            spec.engine,
            max_num_seqs=prefill.max_num_seqs,
            max_num_batched_tokens=prefill.max_num_batched_tokens,
            gpu_memory_utilization=prefill.gpu_memory_utilization,
            additional_config=prefill.additional_config,
            extra_args=prefill.extra_args,
            env=(*spec.engine.env, *prefill.env),
            speculative=dataclasses.replace(speculative, num_tokens=1) if speculative else None,
        ),
    )


def _sizes(spec: NPUInferenceSpec) -> RoleSizes:
    return RoleSizes(spec.parallelism.data, spec.parallelism.tensor, spec.parallelism.pipeline)


def kv_transfer(spec: NPUInferenceSpec, role: str) -> KVTransfer:
    """One role's connector settings (the same port, connector and sizes on both roles)."""
    assert spec.disaggregation is not None
    connector = spec.disaggregation.connector
    prefill, decode = role_spec(spec, "prefill"), role_spec(spec, "decode")
    port = connector.port or reserved_port_floor(max(prefill.npu.count, decode.npu.count))
    return KVTransfer(
        connector=connector.name,
        role=role,
        port=port,
        prefill=_sizes(prefill),
        decode=_sizes(decode),
        engine_id=f"$({POD_NAME_ENV})",
        extra=connector.extra_config,
    )


def connector_problems(spec: NPUInferenceSpec) -> list[tuple[str, str]]:
    """(setting under spec.disaggregation.connector, why) for each rule of the connector a role breaks."""
    found: list[tuple[str, str]] = []
    for role in ROLES:
        for problem in problems(kv_transfer(spec, role), role_spec(spec, role).npu.count):
            if problem not in found:
                found.append(problem)
    return found


def external_decode(spec: NPUInferenceSpec) -> bool:
    """Whether each decode rank is its own API server (`spec.disaggregation.decode.dataParallel: external`)."""
    return spec.disaggregation is not None and spec.disaggregation.decode.external


def decode_rank_ports(spec: NPUInferenceSpec, base: int) -> tuple[int, ...]:
    """The API ports of one decode pod: `base` alone (internal: the leader's one API server), or one
    per data-parallel rank the pod runs, `base` + its index on the pod (external, as vllm-ascend's
    examples/external_online_dp/launch_online_dp.py numbers them from --vllm-start-port)."""
    if not external_decode(spec):
        return (base,)
    decode = role_spec(spec, "decode")
    return external_rank_ports(base, decode.parallelism.data // decode.npu.nodes)
