"""A hub branch or tag is resolved once per rollout: the decision (`revisions`) and what desired_state builds."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_operator.controller.desired import Desired, desired_state
from npu_operator.kube.objects import condition
from npu_operator.status import revisions
from npu_operator.status.findings import PodReport
from npu_operator.status.reports import parse_report
from npu_sandbox.cluster import LocalCluster
from npu_sandbox.controllers import workloads as controllers

from tests.examples import TEST_CONFIG, example

CONFIG = OperatorConfig()
REPO = "Qwen/Qwen2.5-7B-Instruct"
FIRST, SECOND = "a" * 40, "b" * 40
NOW = "2026-12-03T12:00:00Z"


def manifest(**changes: Any) -> dict[str, Any]:
    document = example("qwen2.5-7b-modelscope.yaml")
    document["metadata"].update(namespace="default", uid="uid-1", generation=1)
    document["spec"]["model"]["source"]["modelScope"].update(changes)
    return document


def desired(document: dict[str, Any]) -> Desired:
    result = desired_state(document, CONFIG, frozenset())
    assert not result.problems, result.problems
    return result


def template(result: Desired) -> dict[str, Any]:
    pod_template: dict[str, Any] = result.manifests["Deployment"]["spec"]["template"]
    return pod_template


def fetched_revision(result: Desired) -> str:
    args = template(result)["spec"]["initContainers"][0]["args"]
    revision: str = args[args.index("--revision") + 1]
    return revision


def pinned(document: dict[str, Any], rollout: revisions.Rollout, commit: str) -> dict[str, Any]:
    """`document` as the operator stored it after pinning `commit` for `rollout`."""
    document = copy.deepcopy(document)
    resolved = {"revision": rollout.revision, "rollout": rollout.key, "commit": commit, "resolvedAt": NOW}
    document["status"] = {"model": {"resolved": resolved}}
    return document


def pod(name: str, key: str, commit: str | None = None, repository: str = REPO) -> dict[str, Any]:
    """A pod of the rollout `key` whose fetch finished with `commit` (termination message), or still runs."""
    status: dict[str, Any] = {"phase": "Pending"}
    if commit is not None:
        message = "ModelReady: " + json.dumps(
            {"source": "modelscope", "repository": repository, "revision": commit, "phase": "Ready"}
        )
        terminated = {"exitCode": 0, "message": message}
        status["initContainerStatuses"] = [{"name": "fetch-model", "state": {"terminated": terminated}}]
    return {"metadata": {"name": name, "labels": {revisions.ROLLOUT_LABEL: key}}, "status": status}


def downloading(name: str, commit: str) -> PodReport:
    """The /status of a pod whose fetch resolved the branch and is downloading."""
    model = {"source": "modelscope", "repository": REPO, "revision": commit, "phase": "Downloading"}
    return PodReport(name, parse_report({"state": "fetching", "model": model}))


def test_a_branch_is_fetched_as_written_until_its_commit_is_pinned_then_every_pod_fetches_the_commit() -> None:
    document = manifest(revision="release")
    first = desired(document)
    assert first.rollout is not None and first.rollout.commit is None
    assert first.rollout.revision == "release"
    assert fetched_revision(first) == "release"
    assert "--hold" in template(first)["spec"]["initContainers"][0]["args"]  # resolves; never starts the engine
    assert template(first)["metadata"]["labels"][revisions.ROLLOUT_LABEL] == first.rollout.key

    second = desired(pinned(document, first.rollout, FIRST))
    assert second.rollout == revisions.Rollout(first.rollout.key, "release", FIRST)
    assert fetched_revision(second) == FIRST
    assert "--hold" not in template(second)["spec"]["initContainers"][0]["args"]
    # The same rollout: pinning changes no key, so it cannot start another resolution.
    assert template(second)["metadata"]["labels"][revisions.ROLLOUT_LABEL] == first.rollout.key


def test_no_revision_is_the_hubs_main_branch_and_a_commit_needs_no_resolution() -> None:
    main = desired(manifest())
    assert main.rollout is not None and main.rollout.revision == "master"  # ModelScope's main branch
    commit = desired(manifest(revision=FIRST))
    assert commit.rollout is None
    assert fetched_revision(commit) == FIRST
    assert revisions.ROLLOUT_LABEL not in template(commit)["metadata"]["labels"]


def test_scaling_keeps_the_rollouts_commit_and_a_change_of_what_the_pods_run_resolves_again() -> None:
    document = manifest(revision="release")
    rollout = desired(document).rollout
    assert rollout is not None
    stored = pinned(document, rollout, FIRST)

    scaled = copy.deepcopy(stored)
    scaled["spec"]["replicas"] = 5
    scaled["metadata"]["generation"] = 2
    assert fetched_revision(desired(scaled)) == FIRST  # the pods scale-out adds fetch the same commit

    changed = copy.deepcopy(stored)
    changed["spec"]["engine"]["maxNumSeqs"] = 32
    result = desired(changed)
    assert result.rollout is not None and result.rollout.key != rollout.key
    assert result.rollout.commit is None and fetched_revision(result) == "release"


def test_the_annotation_resolves_again() -> None:
    document = manifest(revision="release")
    rollout = desired(document).rollout
    assert rollout is not None
    again = pinned(document, rollout, FIRST)
    again["metadata"]["annotations"] = {revisions.RESOLVE_ANNOTATION: "2026-12-03"}
    result = desired(again)
    assert result.rollout is not None and result.rollout.key != rollout.key
    assert fetched_revision(result) == "release"


def test_a_recorded_commit_that_is_not_a_commit_is_never_pinned() -> None:
    document = manifest(revision="release")
    rollout = desired(document).rollout
    assert rollout is not None
    for bogus in ("../../x", "$(NPU_MODEL_TOKEN)", "A" * 40, FIRST[:39]):
        assert fetched_revision(desired(pinned(document, rollout, bogus))) == "release"


def test_a_multi_node_replicas_pods_carry_the_rollout_and_its_commit_too() -> None:
    document = example("deepseek-r1-w8a8-2node.yaml")
    document["metadata"].update(namespace="default", uid="uid-2", generation=1)
    model = document["spec"]["model"]
    model.pop("path")
    model["source"] = {"huggingFace": {"repository": "org/deepseek", "revision": "main"}}
    model["cache"] = {"claimName": "model-cache"}
    lws = frozenset({"LeaderWorkerSet"})

    def worker_template(result: Desired) -> dict[str, Any]:
        found: dict[str, Any] = result.manifests["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        return found

    first = desired_state(document, CONFIG, lws)
    assert not first.problems and first.rollout is not None
    assert worker_template(first)["metadata"]["labels"][revisions.ROLLOUT_LABEL] == first.rollout.key
    assert "--hold" in worker_template(first)["spec"]["initContainers"][0]["args"]
    second = desired_state(pinned(document, first.rollout, FIRST), CONFIG, lws)
    args = worker_template(second)["spec"]["initContainers"][0]["args"]
    assert args[args.index("--revision") + 1] == FIRST and "--hold" not in args


def test_the_first_pod_of_the_rollout_by_name_decides_and_then_it_is_kept() -> None:
    rollout = revisions.Rollout("k1", "main", None)
    pods = [pod("x-b", "k1", SECOND), pod("x-a", "k1"), pod("x-0", "old-rollout", "c" * 40)]
    # x-a is still downloading: its /status already names the commit it resolved.
    decided = revisions.resolve(rollout, REPO, pods, [downloading("x-a", FIRST)], None, NOW)
    assert decided == revisions.Resolution(
        {"revision": "main", "rollout": "k1", "commit": FIRST, "pod": "x-a", "resolvedAt": NOW}
    )
    assert revisions.resolution_events(None, decided.resolved) == [
        (
            revisions.REVISION_RESOLVED,
            f"main resolved to commit {FIRST} (reported by pod x-a); every replica of this rollout fetches it",
        )
    ]
    # Pinned: whatever the pods report later (a branch that moved), the record stays as it was.
    kept = revisions.resolve(
        revisions.Rollout("k1", "main", FIRST), REPO, [pod("x-c", "k1", SECOND)], [], decided.resolved, "later"
    )
    assert kept.resolved == decided.resolved and kept.problem is None
    assert revisions.resolution_events(decided.resolved, kept.resolved) == []


def test_nothing_is_pinned_from_another_rollout_another_repository_or_no_report() -> None:
    rollout = revisions.Rollout("k1", "main", None)
    pods = [pod("x-a", "k0", FIRST), pod("x-b", "k1", FIRST, repository="other/repo"), pod("x-c", "k1")]
    decided = revisions.resolve(rollout, REPO, pods, [], None, NOW)
    assert decided == revisions.Resolution({"revision": "main", "rollout": "k1"})  # still resolving
    assert revisions.resolve(None, REPO, pods, [], None, NOW) == revisions.Resolution(None)


def test_a_pod_that_reports_no_commit_degrades_the_resource_and_pins_nothing() -> None:
    rollout = revisions.Rollout("k1", "main", None)
    decided = revisions.resolve(rollout, REPO, [pod("x-a", "k1", "../../../etc")], [], None, NOW)
    assert decided.resolved == {"revision": "main", "rollout": "k1"}
    assert decided.problem is not None
    reason, message = decided.problem
    assert reason == revisions.REVISION_UNRESOLVED
    assert "pod x-a reported '../../../etc'" in message and "not a commit" in message
    # A valid answer from another pod of the rollout is taken instead.
    pods = [pod("x-a", "k1", "../../../etc"), pod("x-b", "k1", SECOND)]
    assert revisions.resolve(rollout, REPO, pods, [], None, NOW).resolved == {
        "revision": "main",
        "rollout": "k1",
        "commit": SECOND,
        "pod": "x-b",
        "resolvedAt": NOW,
    }


# --- the real operator (kopf) over the API emulator; the tests play the controllers and the pods ------

NS = "default"
NAME = "qwen25-7b-ms"
# Reports read every half second (the resolving pods answer on /status).
LIVE_CONFIG = dataclasses.replace(TEST_CONFIG, status_poll_seconds=0.5)


@pytest.fixture
async def live() -> AsyncIterator[tuple[LocalCluster, contextlib.AsyncExitStack]]:
    async with LocalCluster() as cluster, contextlib.AsyncExitStack() as servers:
        await cluster.start_operator(LIVE_CONFIG)
        yield cluster, servers
        await cluster.stop_operator()


def live_manifest(**changes: Any) -> dict[str, Any]:
    document = example("qwen2.5-7b-modelscope.yaml")
    document["metadata"]["namespace"] = NS
    document["spec"]["model"]["source"]["modelScope"].update(changes)
    return document


async def run_controllers(cluster: LocalCluster) -> None:
    """One round of the sandbox's Deployment and ReplicaSet controllers (kube-controller-manager's)."""
    snapshot = await controllers.read_snapshot(cluster, NS)
    for deployment in snapshot.of("deployments"):
        await controllers.reconcile_deployment(cluster, snapshot, deployment)
    snapshot = await controllers.read_snapshot(cluster, NS)
    for replica_set in snapshot.of("replicasets"):
        await controllers.reconcile_replica_set(cluster, snapshot, replica_set)


def fetch_args(pod_or_template: dict[str, Any]) -> list[str]:
    args: list[str] = pod_or_template["spec"]["initContainers"][0]["args"]
    return args


def init_revision(pod_or_template: dict[str, Any]) -> str:
    args = fetch_args(pod_or_template)
    return args[args.index("--revision") + 1]


async def deployment_fetching(cluster: LocalCluster, revision: str) -> dict[str, Any]:
    async def probe() -> Any:
        deployment = await cluster.get("apps/v1", "deployments", NS, NAME)
        return deployment if deployment and init_revision(deployment["spec"]["template"]) == revision else None

    found: dict[str, Any] = await cluster.wait_for(probe, within=20, what=f"the pod template fetching {revision}")
    return found


async def pods_fetching(cluster: LocalCluster, revision: str, count: int) -> list[dict[str, Any]]:
    """Runs the controllers until exactly `count` pods exist and all of them fetch `revision`."""

    async def probe() -> Any:
        await run_controllers(cluster)
        pods = [p for p in await cluster.list_objects("v1", "pods", NS) if not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == count and all(init_revision(p) == revision for p in pods) else None

    found: list[dict[str, Any]] = await cluster.wait_for(probe, within=30, what=f"{count} pods fetching {revision}")
    return sorted(found, key=lambda p: str(p["metadata"]["name"]))


async def holding(
    cluster: LocalCluster, servers: contextlib.AsyncExitStack, pod_obj: dict[str, Any], commit: str
) -> None:
    """A pod whose `npu-runtime fetch --hold` resolved the branch to `commit`: its /status says so (on a
    local port the Pod object names, as the sandbox's kubelet maps ports) and its init container runs."""
    assert "--hold" in fetch_args(pod_obj)
    model = {"source": "modelscope", "repository": REPO, "revision": commit, "phase": "Ready"}

    async def status_page(_: web.Request) -> web.StreamResponse:
        return web.json_response({"state": "fetching", "model": model})

    app = web.Application()
    app.router.add_get("/status", status_page)
    runner = web.AppRunner(app)
    await runner.setup()
    servers.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    containers = copy.deepcopy(pod_obj["spec"]["containers"])
    for container in containers:
        container["ports"] = [{**p, "containerPort": port} if p["name"] == "metrics" else p for p in container["ports"]]
    name = pod_obj["metadata"]["name"]
    await cluster.patch("v1", "pods", NS, name, {"spec": {"containers": containers}})
    init = [{"name": "fetch-model", "state": {"running": {"startedAt": NOW}}}]
    status = {"phase": "Pending", "podIP": "127.0.0.1", "initContainerStatuses": init}
    await cluster.patch("v1", "pods", NS, name, {"status": status}, subresource="status")


async def serving(cluster: LocalCluster, pod_obj: dict[str, Any], commit: str) -> None:
    """A pod whose fetch of the pinned `commit` finished (ModelReady) and whose engine is ready."""
    assert "--hold" not in fetch_args(pod_obj)
    progress = {"source": "modelscope", "repository": REPO, "revision": commit, "phase": "Ready"}
    terminated = {"exitCode": 0, "reason": "Completed", "message": "ModelReady: " + json.dumps(progress)}
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "initContainerStatuses": [{"name": "fetch-model", "state": {"terminated": terminated}}],
    }
    await cluster.patch("v1", "pods", NS, pod_obj["metadata"]["name"], {"status": status}, subresource="status")


async def resolved(cluster: LocalCluster, commit: str | None = None) -> dict[str, Any]:
    async def probe() -> Any:
        obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
        found = ((obj or {}).get("status", {}).get("model") or {}).get("resolved") or {}
        return found if found.get("commit") == commit and (commit or found) else None

    found: dict[str, Any] = await cluster.wait_for(probe, within=20, what=f"status.model.resolved {commit}")
    return found


async def events(cluster: LocalCluster) -> list[dict[str, Any]]:
    found = await cluster.list_objects("v1", "events", NS)
    return [e for e in found if e.get("involvedObject", {}).get("name") == NAME]


async def test_a_branch_moving_between_replicas_pins_one_commit_in_the_template_and_the_status(
    live: tuple[LocalCluster, contextlib.AsyncExitStack],
) -> None:
    cluster, servers = live
    await cluster.apply_npu_inference(live_manifest(revision="release"))
    first_template = (await deployment_fetching(cluster, "release"))["spec"]["template"]
    key = first_template["metadata"]["labels"][revisions.ROLLOUT_LABEL]
    assert "--hold" in fetch_args(first_template)  # the rollout's first pods never start an engine
    assert (await resolved(cluster)) == {"revision": "release", "rollout": key}  # resolving

    # Both replicas resolve the branch, and it moves between them.
    first, second = await pods_fetching(cluster, "release", 2)
    await holding(cluster, servers, first, FIRST)
    await holding(cluster, servers, second, SECOND)
    record = await resolved(cluster, FIRST)  # the first pod by name decides
    assert record["revision"] == "release" and record["rollout"] == key
    assert record["pod"] == first["metadata"]["name"] and record["resolvedAt"]
    pinned_template = (await deployment_fetching(cluster, FIRST))["spec"]["template"]
    assert pinned_template["metadata"]["labels"][revisions.ROLLOUT_LABEL] == key
    assert "--hold" not in fetch_args(pinned_template)

    # The rollout replaces the holding pods; every replica, the ones scale-out adds included, fetches FIRST.
    async def replaced(count: int) -> list[dict[str, Any]]:
        async def probe() -> Any:
            await run_controllers(cluster)
            pods = await cluster.list_objects("v1", "pods", NS)
            for pod_obj in pods:
                if init_revision(pod_obj) == FIRST and not controllers.pod_ready(pod_obj):
                    await serving(cluster, pod_obj, FIRST)
            done = len(pods) == count and all(init_revision(p) == FIRST and controllers.pod_ready(p) for p in pods)
            return pods if done else None

        found: list[dict[str, Any]] = await cluster.wait_for(probe, within=30, what=f"{count} pods serving FIRST")
        return found

    await replaced(2)
    await cluster.patch(crd.API_VERSION, crd.PLURAL, NS, NAME, {"spec": {"replicas": 3}})
    await replaced(3)
    await asyncio.sleep(3)  # several resyncs and polls: no new resolution, no new rollout
    deployment = await cluster.get("apps/v1", "deployments", NS, NAME)
    assert deployment is not None and init_revision(deployment["spec"]["template"]) == FIRST
    assert (await resolved(cluster, FIRST)) == record
    status_model = (await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME) or {})["status"]["model"]
    assert status_model["revision"] == FIRST and status_model["phase"] == "Ready"
    resolutions = [e for e in await events(cluster) if e.get("reason") == revisions.REVISION_RESOLVED]
    assert len(resolutions) == 1 and FIRST in resolutions[0]["message"]

    # The annotation is a new rollout: the branch is resolved again (it has moved to SECOND meanwhile).
    annotation = {"metadata": {"annotations": {revisions.RESOLVE_ANNOTATION: "again"}}}
    await cluster.patch(crd.API_VERSION, crd.PLURAL, NS, NAME, annotation)
    again = (await deployment_fetching(cluster, "release"))["spec"]["template"]
    assert again["metadata"]["labels"][revisions.ROLLOUT_LABEL] != key

    async def a_holding_pod() -> Any:
        await run_controllers(cluster)
        pods = await cluster.list_objects("v1", "pods", NS)
        return next((p for p in pods if "--hold" in fetch_args(p)), None)

    await holding(cluster, servers, await cluster.wait_for(a_holding_pod, within=30), SECOND)
    assert (await resolved(cluster, SECOND))["rollout"] == again["metadata"]["labels"][revisions.ROLLOUT_LABEL]
    await deployment_fetching(cluster, SECOND)


async def test_a_pod_that_reports_no_commit_degrades_the_resource_with_an_event(
    live: tuple[LocalCluster, contextlib.AsyncExitStack],
) -> None:
    cluster, servers = live
    await cluster.apply_npu_inference(live_manifest(revision="release"))
    await deployment_fetching(cluster, "release")
    for replica in await pods_fetching(cluster, "release", 2):
        await holding(cluster, servers, replica, "../../../etc/passwd")

    async def degraded() -> Any:
        obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, NAME)
        found = condition(obj or {}, "Degraded")
        return found if found.get("reason") == revisions.REVISION_UNRESOLVED else None

    found = await cluster.wait_for(degraded, within=20, what="Degraded/RevisionUnresolved")
    assert "'../../../etc/passwd'" in found["message"] and "not a commit" in found["message"]

    async def warned() -> Any:  # kopf posts the Event from its own queue, after the status write
        return [e for e in await events(cluster) if e.get("reason") == revisions.REVISION_UNRESOLVED]

    warnings = await cluster.wait_for(warned, within=10, what="a RevisionUnresolved Event")
    assert warnings[0]["type"] == "Warning"
    deployment = await cluster.get("apps/v1", "deployments", NS, NAME)
    assert deployment is not None and init_revision(deployment["spec"]["template"]) == "release"  # nothing pinned
