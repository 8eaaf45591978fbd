"""A two-node replica end to end: `npu-sandbox --example sandbox-cpu-2node.yaml --kill-worker`.

The real operator renders a LeaderWorkerSet; the sandbox's stand-in for LeaderWorkerSet's
controller makes the StatefulSets and pods; the kubelet runs the leader (vLLM's API server and
DP rank 0) and the worker (DP rank 1, headless) with real engines on CPU. The run is judged by its
JSON summary: Ready, a completion through the leader's Service, the worker's engine killed and
the group recreated (RecreateGroupOnPodRestart) until Ready again, then everything deleted.
One run (two engines, twice) is shared by the tests of this module.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import SandboxRun, run_sandbox
from tests.e2e.test_sandbox import processes_mentioning
from tests.runtime.serve_helpers import alive

NAME = "tiny-llama-2node"


# Its own sandbox run: another example (a two-node group), and its worker is killed on the way.
@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory: pytest.TempPathFactory) -> SandboxRun:
    return run_sandbox(
        tmp_path_factory.mktemp("two-node"),
        "--example",
        "sandbox-cpu-2node.yaml",
        "--kill-worker",
        "--no-prometheus",
    )


@pytest.mark.engine
def test_a_two_node_replica_serves_recovers_its_group_and_is_deleted_whole(
    two_node_run: SandboxRun,
) -> None:
    result, summary, workdir = two_node_run.result, two_node_run.summary, two_node_run.workdir
    assert summary["ready"] is True and summary["phase"] == "Ready"
    assert (summary["requested_mode"], summary["effective_mode"]) == ("FULL_DECODE_ONLY", "NONE")
    assert summary["pods"] == [f"{NAME}-0", f"{NAME}-0-1"]
    assert summary["served_by"] == f"{NAME}-0"  # the Service selects leaders only
    assert isinstance(summary["completion"], str)
    for line in ("kubectl get npuinf,leaderworkersets,statefulsets,pods", f"leaderworkerset.x-k8s.io/{NAME}"):
        assert line in result.stdout, line
    assert f"statefulset.apps/{NAME}-0 " in result.stdout  # the group's worker StatefulSet

    recovery = summary["recovery"]
    assert recovery["recreate_events"] == [
        f"Worker pod {NAME}-0-1 failed, deleted leader pod {NAME}-0 to recreate group 0"
    ]
    assert any(state.startswith("Progressing/") for state in recovery["states"]), recovery["states"]
    assert recovery["states"][-1] == "Ready/RolloutComplete", recovery["states"]
    print(f"seconds from killing the worker's engine to Ready again: {recovery['seconds_to_ready']}")

    assert summary["deletion"]["left"] == []
    for pid in summary["pids"].values():
        assert pid is not None and not alive(pid), f"process {pid} outlived the sandbox"
    assert processes_mentioning(str(workdir)) == []


@pytest.mark.engine
def test_both_ranks_are_in_status_graph(
    two_node_run: SandboxRun,
) -> None:
    summary = two_node_run.summary
    for graph in (summary["graph"], summary["recovery"]["graph"]):
        assert graph["rankCount"] == 2, graph
        assert len(graph["ranks"]) == 2, graph
