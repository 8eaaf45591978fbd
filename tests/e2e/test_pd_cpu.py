"""Prefill/decode disaggregation on CPU, end to end in the sandbox: `npu-sandbox --example sandbox-cpu-pd.yaml`.

The helm-installed operator (under the chart's RBAC) renders the DisaggregatedSet, the router
Deployment and the Services; the sandbox's DisaggregatedSet stand-in makes a LeaderWorkerSet per
role as LeaderWorkerSet v0.10's controller does, its LeaderWorkerSet stand-in the StatefulSets and
pods; the kubelet runs the two roles' real `npu-runtime serve` (two vLLM CPU engines, their
Mooncake connector mapped by the runtime to vLLM's file-based ExampleConnector) and the router
(`npu-runtime route`, pointed at the role Services' pods).

The run is judged by its JSON summary. A prompt longer than one KV block through the resource's
Service (the router) must leave the prompt's KV as files (the prefill engine's save), make the
decode engine log "External Cache Hit!" (its load), and answer exactly what the prefill engine
alone, called directly, generates greedily (it prefills and decodes itself). The resource is Ready,
`status.graph.roles` shows each role's graph mode read from its pods, each engine's /status its
role and connector, and everything is deleted at the end. One engine pair per CI run.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import SandboxRun, run_sandbox
from tests.e2e.test_sandbox import processes_mentioning
from tests.runtime.serve_helpers import alive

NAME = "tiny-llama-pd"
MAX_TOKENS = 12


# Its own sandbox run: another example (prefill and decode engines behind the router).
@pytest.fixture(scope="module")
def pd_run(tmp_path_factory: pytest.TempPathFactory) -> SandboxRun:
    return run_sandbox(tmp_path_factory.mktemp("pd"), "--example", "sandbox-cpu-pd.yaml", "--no-prometheus")


@pytest.mark.engine
def test_a_completion_through_the_router_equals_one_engines_greedy_output(
    pd_run: SandboxRun,
) -> None:
    summary = pd_run.summary
    assert summary["ready"] is True and summary["phase"] == "Ready"
    pd = summary["pd"]
    assert pd["prompt_tokens"] > 128, f"the prompt must fill more than one KV block (128 tokens on CPU): {pd}"
    # The transfer: the prefill engine saved the prompt's KV as files, the decode engine loaded them.
    assert pd["kv_files"], pd
    assert pd["decode_cache_hit"] is True, f"no 'External Cache Hit!' in {pd['decode_log']}"
    # Greedy on both paths: the same tokens (the tiny model's may print as nothing), the same text.
    assert len(pd["routed_token_ids"]) == MAX_TOKENS and pd["routed_token_ids"] == pd["direct_token_ids"], pd
    assert isinstance(pd["routed"], str) and pd["routed"] == pd["direct"]
    assert summary["served_by"].startswith(f"{NAME}-")  # the router's pod, behind the resource's Service
    assert summary["served_by"] not in pd["pods"]["prefill"] + pd["pods"]["decode"]


@pytest.mark.engine
def test_each_role_reports_its_connector_and_graph_mode_in_the_resources_status(
    pd_run: SandboxRun,
) -> None:
    result, summary, workdir = pd_run.result, pd_run.summary, pd_run.workdir
    for role in ("prefill", "decode"):
        kv = summary["pd"]["kv_transfer"][role]
        assert kv["role"] == role
        assert (kv["requested_connector"], kv["connector"]) == ("MooncakeConnectorV1", "ExampleConnector")
        assert "needs an NPU" in kv["note"]
    roles = summary["graph"]["roles"]
    # Read by the operator from each role's pods: the decode role asks for FULL_DECODE_ONLY, which a
    # CPU cannot capture (NONE, with the downgrade); the prefill role asks for NONE.
    assert (roles["prefill"]["requestedMode"], roles["prefill"]["effectiveMode"]) == ("NONE", "NONE")
    assert (roles["decode"]["requestedMode"], roles["decode"]["effectiveMode"]) == ("FULL_DECODE_ONLY", "NONE")
    assert roles["decode"]["downgrades"] and "downgrades" not in roles["prefill"]
    assert roles["decode"]["ranks"][0]["pod"] in summary["pd"]["pods"]["decode"]
    downgraded = [e["message"] for e in summary["events"] if e["reason"] == "GraphModeDowngraded"]
    assert downgraded and all(message.startswith("role decode, ") for message in downgraded), downgraded
    assert "kubectl get npuinf,leaderworkersets,deployments,pods" in result.stdout

    assert summary["deletion"]["left"] == []
    for pid in summary["pids"].values():
        assert pid is not None and not alive(pid), f"process {pid} outlived the sandbox"
    assert processes_mentioning(str(workdir)) == []
