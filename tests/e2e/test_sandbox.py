"""README's first command, end to end: the sandbox in non-interactive mode, judged by its JSON summary,
and by what its Prometheus holds (every dashboard panel answered: test_dashboard_queries.py says how).

Every test that only reads the one sandbox run (`sandbox_run`, a session fixture) is in this file, so
that the engine tests' workers (`--dist loadfile`) start it once."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from npu_sandbox.demo import prometheus

from tests.e2e.conftest import SandboxRun
from tests.e2e.test_dashboard_queries import DASHBOARD, Selection, answer_panels, generator
from tests.runtime.serve_helpers import alive


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and alive(int(entry.name)):
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.engine
def test_the_sandbox_runs_the_whole_chain_and_leaves_nothing_behind(sandbox_run: SandboxRun) -> None:
    result, summary, workdir = sandbox_run.result, sandbox_run.summary, sandbox_run.workdir

    assert summary["ready"] is True
    assert summary["phase"] == "Ready"
    assert (summary["requested_mode"], summary["effective_mode"]) == ("FULL_DECODE_ONLY", "NONE")
    assert [d["reason"] for d in summary["downgrades"]] == ["CpuHasNoGraphs"]
    downgrade_events = [e for e in summary["events"] if e["reason"] == "GraphModeDowngraded"]
    assert len(downgrade_events) == 1
    assert downgrade_events[0]["type"] == "Warning"
    assert isinstance(summary["completion"], str)
    assert any(
        line.startswith('npu_graph_mode_info{effective="NONE",requested="FULL_DECODE_ONLY"} 1')
        for line in summary["metrics"]
    )
    assert any(line.startswith("npu_graph_downgrades_total{") for line in summary["metrics"])

    for line in ("kubectl get npuinf", "NAME ", "tiny-llama", "Ready after", "cleaning up"):
        assert line in result.stdout
    for pid in summary["pids"].values():
        assert pid is not None and not alive(pid), f"process {pid} outlived the sandbox"
    assert processes_mentioning(str(workdir)) == []


@pytest.mark.engine
def test_the_product_is_installed_upgraded_and_uninstalled_with_the_real_helm(sandbox_run: SandboxRun) -> None:
    """README's cluster commands, run by the sandbox: the operator is the chart's pod under the chart's RBAC."""
    result, summary = sandbox_run.result, sandbox_run.summary
    for line in (
        "helm install npu-operator charts/npu-inference-operator -n npu-system --create-namespace",
        "STATUS: deployed",
        "serviceaccount/npu-operator-npu-inference-operator",
        "clusterrole.rbac.authorization.k8s.io/npu-operator-npu-inference-operator",
        "npu-operator run (ServiceAccount npu-system/npu-operator-npu-inference-operator",
    ):
        assert line in result.stdout
    # The NPUInference went Ready through that operator (the other test checks the rest of the chain).
    assert summary["ready"] is True
    upgrade = summary["helm"]["upgrade"]
    assert upgrade["revision"] == 2 and upgrade["log_level"] == "DEBUG"
    assert not set(upgrade["operator_pods"]["after"]) & set(upgrade["operator_pods"]["before"])  # rolled
    assert upgrade["peers"]["new"]  # the new operator patched its peering object: authorized, alive
    assert upgrade["ready"] and upgrade["model_pods_unchanged"] and isinstance(upgrade["completion"], str)
    uninstall = summary["helm"]["uninstall"]
    assert uninstall["left"] == {"deployments": [], "serviceaccounts": [], "pods": []}
    assert uninstall["cluster_roles"] == [] and uninstall["releases"] == []
    # helm.sh/resource-policy: keep: the CRDs stay, and with them the users' resources, still serving.
    assert {"npuinferences.inference.npu.dev", "clusterkopfpeerings.kopf.dev"} <= set(uninstall["crds"])
    assert uninstall["resource_kept"] is True and isinstance(uninstall["completion"], str)
    for pid in summary["helm"]["operator_pids"]:
        assert not alive(pid), f"operator process {pid} outlived the sandbox"


@pytest.mark.engine
def test_a_real_prometheus_scraped_the_sandbox_and_shows_the_plan_downgrade_alert(sandbox_run: SandboxRun) -> None:
    if prometheus.binary() is None:
        pytest.skip("prometheus not found: install Debian's prometheus package (scripts/bootstrap does it as root)")
    found = sandbox_run.summary["prometheus"]
    # Every npu_graph_* metric the CPU build produces, with the labels the chart's PodMonitor gives.
    assert found["metrics"] == ["npu_graph_decode_batches_total", "npu_graph_downgrades_total", "npu_graph_mode_info"]
    for series in found["series"]:
        for label in ('namespace="default"', 'inference_npu_dev_name="tiny-llama"', 'pod="tiny-llama-'):
            assert label in series, series
    assert any('stage="plan"' in s and 'reason="CpuHasNoGraphs"' in s for s in found["series"])
    alerts = {(a["name"], a["state"]) for a in found["alerts"]}
    assert ("NPUGraphModeDowngradedByPlan", "pending") in alerts or ("NPUGraphModeDowngradedByPlan", "firing") in alerts
    plan = next(a for a in found["alerts"] if a["name"] == "NPUGraphModeDowngradedByPlan")
    assert plan["labels"]["reason"] == "CpuHasNoGraphs" and plan["labels"]["to_mode"] == "NONE"
    assert plan["summary"] == "default/tiny-llama: planned NONE instead of FULL_DECODE_ONLY"
    assert {a["name"] for a in found["alerts"]} == {"NPUGraphModeDowngradedByPlan"}, found["alerts"]
    for heading in ("npu_graph_* series scraped (GET /api/v1/series)", "alerts pending or firing"):
        assert heading in sandbox_run.result.stdout


@pytest.mark.engine
def test_every_dashboard_panel_answers_from_the_sandboxs_prometheus(sandbox_run: SandboxRun, tmp_path: Path) -> None:
    if prometheus.binary() is None:
        pytest.skip("prometheus not found: install Debian's prometheus package (scripts/bootstrap does it as root)")
    found = sandbox_run.summary["prometheus"]
    data = tmp_path / "prometheus" / "data"
    shutil.copytree(found["data"], data)  # the sandbox's own copy stays as it was
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    chosen: Selection = {"namespace": ["default"], "npuinference": ["tiny-llama"]}
    everything: Selection = {"namespace": "All", "npuinference": "All"}  # the dashboard's default

    (answers, answers_for_all), listed = asyncio.run(
        answer_panels(board, data, found["window"], [chosen, everything], float(found["scrape_interval_seconds"]))
    )

    npu_only = generator().NPU_ONLY
    # The sandbox runs neither KEDA nor kube-state-metrics: the autoscaling panels stay empty too.
    keda_only = generator().KEDA_ONLY
    # Nor does its example serve LoRA adapters (tests/e2e/test_lora_sandbox.py reads the pods' series).
    lora_only = generator().LORA_ONLY
    # Nor cache-aware P/D routers (tests/runtime/serving/test_serve_cache_aware.py reads their series).
    cache_only = generator().CACHE_ONLY
    empty_here = npu_only | keda_only | lora_only | cache_only
    only = {**dict.fromkeys(lora_only, "LoRA only"), **dict.fromkeys(keda_only, "KEDA only")}
    only |= dict.fromkeys(cache_only, "cache-aware routing only")
    only |= dict.fromkeys(npu_only, "NPU only")
    report = "\n".join(
        f"{title:58} {'data' if any(refs.values()) else 'no data':8} {only.get(title, '')}"
        for title, refs in answers.items()
    )
    print("\n" + report)
    assert listed["namespace"] == ["default"] and listed["npuinference"] == ["tiny-llama"], listed
    assert npu_only <= answers.keys(), npu_only - answers.keys()
    for title, refs in answers.items():
        if title in empty_here:
            assert not any(refs.values()), (
                f"{title}: data here, yet listed as NPU, KEDA, LoRA or cache-aware routing only\n{report}"
            )
        else:
            assert all(refs.values()), f"{title}: no data for query {refs} on CPU\n{report}"
    assert answers_for_all == answers, "with All selected, the panels should answer as for the one resource"
