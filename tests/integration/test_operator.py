"""The real operator (kopf, our handlers, our client) against the API emulator over HTTP.

Nothing is patched: the operator logs in through a kubeconfig, watches, creates children and
writes status over real HTTP. The tests play the deployment controller where one is needed
(they write a Deployment's status) and count the requests the API served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

import kopf
import pytest
from npu_operator.api import crd
from npu_operator.controller import handlers
from npu_operator.kube import client
from npu_operator.kube.objects import condition
from npu_sandbox.cluster import ApiRejected, LocalCluster

from tests.examples import TEST_CONFIG, example

NS = "default"


def manifest(name: str = "sandbox-cpu.yaml", **spec: Any) -> dict[str, Any]:
    document = example(name)
    document["metadata"]["namespace"] = NS
    document["spec"].update(spec)
    return document


async def resource(cluster: LocalCluster, name: str) -> dict[str, Any]:
    obj = await cluster.get(crd.API_VERSION, crd.PLURAL, NS, name)
    assert obj is not None
    return obj


async def wait_condition(cluster: LocalCluster, name: str, kind: str, status: str, reason: str | None = None) -> Any:
    async def probe() -> Any:
        obj = await resource(cluster, name)
        found = condition(obj, kind)
        return obj if found.get("status") == status and reason in (None, found.get("reason")) else None

    return await cluster.wait_for(probe, within=20, what=f"{kind}={status} ({reason})")


async def child(cluster: LocalCluster, api_version: str, plural: str, name: str) -> dict[str, Any] | None:
    return await cluster.get(api_version, plural, NS, name)


async def settle_deployment(cluster: LocalCluster, name: str, ready: int) -> None:
    """Play the deployment controller: all replicas updated, `ready` of them ready."""
    deployment = await child(cluster, "apps/v1", "deployments", name)
    assert deployment is not None
    generation, replicas = deployment["metadata"]["generation"], deployment["spec"]["replicas"]
    await cluster.report_deployment(NS, name, generation, replicas, ready)


async def events(cluster: LocalCluster, name: str) -> list[dict[str, Any]]:
    return [
        e for e in await cluster.list_objects("v1", "events", NS) if e.get("involvedObject", {}).get("name") == name
    ]


async def test_create_builds_owned_children_and_reports_progressing(operator: LocalCluster) -> None:
    created = await operator.apply_npu_inference(manifest(replicas=2))
    uid = created["metadata"]["uid"]
    obj = await wait_condition(operator, "tiny-llama", "Progressing", "True")

    for api_version, plural in [("apps/v1", "deployments"), ("v1", "services"), ("policy/v1", "poddisruptionbudgets")]:
        found = await child(operator, api_version, plural, "tiny-llama")
        assert found is not None, plural
        owners = found["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("NPUInference", uid, True)]
    status = obj["status"]
    assert status["phase"] == "Progressing"
    assert status["observedGeneration"] == 1
    assert status["selector"] == "app.kubernetes.io/name=npu-inference,inference.npu.dev/name=tiny-llama"
    assert status["endpoint"] == "http://tiny-llama.default.svc:8000/v1"
    assert condition(obj, "Ready")["status"] == "False"
    assert condition(obj, "Degraded")["status"] == "False"


async def test_spec_change_updates_the_deployment_and_is_observed(operator: LocalCluster) -> None:
    await operator.apply_npu_inference(manifest())
    await wait_condition(operator, "tiny-llama", "Progressing", "True")
    changed = manifest()
    changed["spec"]["engine"]["maxNumSeqs"] = 4
    changed["spec"]["replicas"] = 3
    await operator.apply_npu_inference(changed)

    async def updated() -> Any:
        deployment = await child(operator, "apps/v1", "deployments", "tiny-llama")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"] if deployment else []
        return deployment if deployment and deployment["spec"]["replicas"] == 3 and "4" in args else None

    deployment = await operator.wait_for(updated, within=20, what="the Deployment to follow the spec")
    assert deployment["metadata"]["generation"] == 2

    async def observed() -> Any:
        obj = await resource(operator, "tiny-llama")
        return obj["status"].get("observedGeneration") == 2 and obj["status"]["ready"] == "0/3"

    await operator.wait_for(observed, within=20, what="observedGeneration 2")


async def test_a_spec_field_removed_is_removed_from_the_deployment(operator: LocalCluster) -> None:
    with_selector = manifest()
    with_selector["spec"]["template"] = {"nodeSelector": {"zone": "a", "pool": "npu"}}
    await operator.apply_npu_inference(with_selector)

    async def node_selector() -> Any:
        deployment = await child(operator, "apps/v1", "deployments", "tiny-llama")
        return deployment and deployment["spec"]["template"]["spec"].get("nodeSelector")

    assert await operator.wait_for(node_selector) == {"pool": "npu", "zone": "a"}
    without = manifest()
    without["spec"]["template"] = {"nodeSelector": {"pool": "npu"}}
    # A merge patch cannot drop a map key by omission: write the whole template as kubectl would.
    await operator.patch(
        crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", {"spec": {"template": {"nodeSelector": {"zone": None}}}}
    )

    async def zone_gone() -> Any:
        return await node_selector() == {"pool": "npu"}

    await operator.wait_for(zone_gone, what="the dropped nodeSelector key to leave the Deployment")


async def test_a_deleted_child_is_recreated_and_a_hand_edit_is_reverted(operator: LocalCluster) -> None:
    await operator.apply_npu_inference(manifest())
    await wait_condition(operator, "tiny-llama", "Progressing", "True")
    service = await child(operator, "v1", "services", "tiny-llama")
    assert service is not None
    await operator.delete("v1", "services", NS, "tiny-llama")

    async def recreated() -> Any:
        again = await child(operator, "v1", "services", "tiny-llama")
        return again if again and again["metadata"]["uid"] != service["metadata"]["uid"] else None

    await operator.wait_for(recreated, within=10, what="the Service to be recreated")

    await operator.patch("apps/v1", "deployments", NS, "tiny-llama", {"spec": {"replicas": 7}})

    async def reverted() -> Any:
        deployment = await child(operator, "apps/v1", "deployments", "tiny-llama")
        return deployment and deployment["spec"]["replicas"] == 1

    await operator.wait_for(reverted, within=10, what="the hand-edited replicas to be put back")


async def test_scaling_to_one_replica_removes_the_disruption_budget(operator: LocalCluster) -> None:
    await operator.apply_npu_inference(manifest(replicas=2))

    async def pdb() -> Any:
        return await child(operator, "policy/v1", "poddisruptionbudgets", "tiny-llama")

    await operator.wait_for(pdb)
    await operator.patch(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", {"spec": {"replicas": 1}})

    async def gone() -> bool:
        return await pdb() is None

    await operator.wait_for(gone, what="the PDB to be deleted")


async def test_ready_deployment_makes_the_resource_ready_with_one_event(operator: LocalCluster) -> None:
    await operator.apply_npu_inference(manifest())
    await wait_condition(operator, "tiny-llama", "Progressing", "True")
    await settle_deployment(operator, "tiny-llama", ready=1)
    obj = await wait_condition(operator, "tiny-llama", "Ready", "True", "Serving")
    assert obj["status"]["phase"] == "Ready"
    assert obj["status"]["ready"] == "1/1"
    assert condition(obj, "Progressing")["status"] == "False"

    async def ready_event() -> Any:
        return [e for e in await events(operator, "tiny-llama") if e["reason"] == "Ready"]

    found = await operator.wait_for(ready_event)
    await asyncio.sleep(2.5 * TEST_CONFIG.resync_seconds)
    assert len(await ready_event()) == len(found) == 1
    assert found[0]["type"] == "Normal"


async def test_invalid_spec_is_marked_once_and_then_left_alone(operator: LocalCluster) -> None:
    bad = manifest()
    bad["spec"]["npu"] = {"count": 1, "resourceName": "kubernetes.io/npu"}
    bad["spec"]["engine"]["extraArgs"] = ["--max-num-seqs=4"]
    await operator.apply_npu_inference(bad)
    obj = await wait_condition(operator, "tiny-llama", "Degraded", "True", "InvalidSpec")
    message = condition(obj, "Degraded")["message"]
    assert "spec.npu.resourceName" in message and "kubernetes.io domain" in message
    assert "spec.engine.extraArgs[0]" in message and "spec.engine.maxNumSeqs" in message
    assert obj["status"]["phase"] == "Failed"
    assert await child(operator, "apps/v1", "deployments", "tiny-llama") is None

    async def warning() -> Any:
        return [e for e in await events(operator, "tiny-llama") if e["reason"] == "InvalidSpec"]

    (event,) = await operator.wait_for(warning)
    assert event["type"] == "Warning" and "spec.npu.resourceName" in event["message"]
    # kubectl describe's "From" and the reporting controller name the operator, not kopf
    assert event["source"]["component"] == event["reportingComponent"] == "npu-operator"

    await asyncio.sleep(1.0)  # let kopf finish its own bookkeeping of the failed handler
    before = len(operator.writes())
    await asyncio.sleep(3 * TEST_CONFIG.resync_seconds)
    late = operator.writes()[before:]
    assert late == [], [(r.method.value, r.url.path, r.data) for r in late]

    fix = {"spec": {"npu": {"resourceName": None}, "engine": {"extraArgs": None}}}
    await operator.patch(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", fix)
    await wait_condition(operator, "tiny-llama", "Degraded", "False")
    assert await child(operator, "apps/v1", "deployments", "tiny-llama") is not None


async def test_a_tenants_prometheus_and_gateway_are_refused_as_invalid_spec(operator: LocalCluster) -> None:
    """Issue 33 items 7 and 15 on the real operator: a Prometheus address KEDA would query from its pod,
    and an HTTPRoute without hostnames on another namespace's Gateway, are the resource's problem
    (Degraded/InvalidSpec and one Warning Event, nothing created), not the operator's."""
    bad = manifest(
        autoscaling={"maxReplicas": 2, "prometheus": {"address": "http://169.254.169.254/latest/meta-data"}},
        routing={"gateway": {"name": "shared", "namespace": "gateway-system"}},
        metrics={"podMonitor": {"enabled": True}},  # what autoscaling reads
    )
    await operator.apply_npu_inference(bad)
    obj = await wait_condition(operator, "tiny-llama", "Degraded", "True", "InvalidSpec")
    message = condition(obj, "Degraded")["message"]
    for field in (
        "spec.autoscaling.prometheus.address",
        "spec.routing.gateway.hostnames",
        "spec.routing.gateway.namespace",
    ):
        assert field in message, message
    assert await child(operator, "apps/v1", "deployments", "tiny-llama") is None

    async def warning() -> Any:
        return [e for e in await events(operator, "tiny-llama") if e["reason"] == "InvalidSpec"]

    (event,) = await operator.wait_for(warning)
    assert event["type"] == "Warning" and "spec.autoscaling.prometheus.address" in event["message"]

    # The operator's own Prometheus and a route for the resource's hosts on its own namespace's Gateway pass.
    fix = {
        "spec": {
            "autoscaling": {"prometheus": None},
            "routing": {"gateway": {"namespace": None, "hostnames": ["tiny.example.com"]}},
        }
    }
    await operator.patch(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", fix)
    await wait_condition(operator, "tiny-llama", "Degraded", "False")
    assert await child(operator, "apps/v1", "deployments", "tiny-llama") is not None


async def test_schema_violations_are_refused_by_the_api(cluster: LocalCluster) -> None:
    bad = manifest()
    bad["spec"]["parallelism"] = {"tensor": 2}
    with pytest.raises(ApiRejected) as caught:
        await cluster.apply_npu_inference(bad)
    assert caught.value.status == 422
    assert "must equal npu.count" in caught.value.body["message"]


async def test_a_settled_resource_costs_no_writes(operator: LocalCluster) -> None:
    await operator.apply_npu_inference(manifest(replicas=2))
    await wait_condition(operator, "tiny-llama", "Progressing", "True")
    await settle_deployment(operator, "tiny-llama", ready=2)
    await wait_condition(operator, "tiny-llama", "Ready", "True")
    await asyncio.sleep(1.5)  # the Ready event is posted asynchronously

    requests_before = len(operator.emulator.history)
    writes_before = len(operator.writes())
    window = 3 * TEST_CONFIG.resync_seconds
    await asyncio.sleep(window)
    writes = operator.writes()[writes_before:]
    reads = len(operator.emulator.history) - requests_before - len(writes)
    print(f"\nidle for {window:.1f}s (3 resync intervals): {len(writes)} writes, {reads} reads")
    assert writes == [], [f"{r.method.value} {r.url.path}" for r in writes]


async def test_restarting_the_operator_repeats_no_event_and_no_write(operator: LocalCluster) -> None:
    await operator.apply_npu_inference(manifest())
    await wait_condition(operator, "tiny-llama", "Progressing", "True")
    await settle_deployment(operator, "tiny-llama", ready=1)
    await wait_condition(operator, "tiny-llama", "Ready", "True")
    await asyncio.sleep(1.5)
    events_before = await events(operator, "tiny-llama")

    await operator.stop_operator()
    await operator.start_operator(TEST_CONFIG)
    await asyncio.sleep(1.0)  # resume handlers and the first reconcile
    writes_before = len(operator.writes())
    await asyncio.sleep(3 * TEST_CONFIG.resync_seconds)
    assert await events(operator, "tiny-llama") == events_before
    resource_writes = [r for r in operator.writes()[writes_before:] if "kopfpeerings" not in r.url.path]
    assert resource_writes == []


async def test_a_foreign_service_is_left_alone_and_reported(operator: LocalCluster) -> None:
    await operator.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "tiny-llama", "namespace": NS},
            "spec": {"ports": [{"port": 80}]},
        },
        "services",
    )
    await operator.apply_npu_inference(manifest())
    obj = await wait_condition(operator, "tiny-llama", "Degraded", "True", "ChildConflict")
    assert "Service default/tiny-llama" in condition(obj, "Degraded")["message"]
    service = await child(operator, "v1", "services", "tiny-llama")
    assert service is not None and service["spec"]["ports"] == [{"port": 80}]


async def test_pod_monitor_is_created_when_the_api_is_served() -> None:
    async with LocalCluster(pod_monitors=True) as cluster:
        await cluster.start_operator(TEST_CONFIG)
        try:
            with_monitor = manifest()
            with_monitor["spec"]["metrics"] = {"podMonitor": {"enabled": True, "labels": {"release": "prom"}}}
            await cluster.apply_npu_inference(with_monitor)

            async def monitor() -> Any:
                return await child(cluster, "monitoring.coreos.com/v1", "podmonitors", "tiny-llama")

            found = await cluster.wait_for(monitor)
            assert found["metadata"]["labels"]["release"] == "prom"
            await cluster.patch(
                crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", {"spec": {"metrics": {"podMonitor": {"enabled": False}}}}
            )

            async def monitor_gone() -> bool:
                return await monitor() is None

            await cluster.wait_for(monitor_gone, what="the PodMonitor no longer asked for to be deleted")
            assert [e["port"] for e in found["spec"]["podMetricsEndpoints"]] == ["metrics", "http"]
        finally:
            await cluster.stop_operator()


async def test_pod_monitor_without_its_api_is_noted_in_the_status(operator: LocalCluster) -> None:
    with_monitor = manifest()
    with_monitor["spec"]["metrics"] = {"podMonitor": {"enabled": True}}
    await operator.apply_npu_inference(with_monitor)
    obj = await wait_condition(operator, "tiny-llama", "Progressing", "True")
    assert "monitoring.coreos.com/v1 API is not installed" in condition(obj, "Degraded")["message"]


async def test_deleting_the_resource_collects_its_children_and_the_workers_forget_it(
    operator: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    await operator.apply_npu_inference(manifest())
    obj = await wait_condition(operator, "tiny-llama", "Progressing", "True")
    assert "finalizers" not in obj["metadata"]  # nothing holds a deletion back, even without the operator
    await operator.delete(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama")
    assert await operator.get(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama") is None  # at once

    async def children_gone_and_forgotten() -> bool:
        ended = any("the workers forget it" in record.getMessage() for record in caplog.records)
        return ended and await child(operator, "apps/v1", "deployments", "tiny-llama") is None

    await operator.wait_for(children_gone_and_forgotten, what="the children and the workers forgetting it")


async def test_the_finalizer_an_earlier_operator_left_is_removed(operator: LocalCluster) -> None:
    old = manifest()
    old["metadata"]["finalizers"] = [f"{crd.GROUP}/finalizer"]
    await operator.apply_npu_inference(old)

    async def released() -> Any:
        obj = await operator.get(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama")
        return obj if obj is not None and not obj["metadata"].get("finalizers") else None

    await operator.wait_for(released, what="kopf removing the finalizer")
    await operator.delete(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama")
    assert await operator.get(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama") is None


def test_a_kopf_whose_registry_is_unknown_is_refused_with_a_message() -> None:
    with pytest.raises(RuntimeError, match="the daemon's finalizer cannot be switched off"):
        handlers.without_finalizer(handlers.act_while_leading, kopf.OperatorRegistry())


@pytest.mark.parametrize(
    ("namespaces", "standalone", "followed"),
    [((), False, "clusterkopfpeerings"), (("models",), False, "kopfpeerings"), ((), True, None)],
)
def test_the_workers_follow_the_peering_object_kopf_uses_for_the_scope(
    namespaces: tuple[str, ...], standalone: bool, followed: str | None
) -> None:
    config = dataclasses.replace(TEST_CONFIG, namespaces=namespaces, standalone=standalone)
    daemons = handlers.registry(config)._spawning.get_all_handlers()
    selectors = [d.selector for d in daemons if d.selector is not None]
    assert [(s.plural or s.any_name, d.requires_finalizer) for s, d in zip(selectors, daemons, strict=True)] == (
        [(followed, False)] if followed else []
    )
    if followed:  # only the peering object of the operator's own name
        assert [(d.field, d.value) for d in daemons] == [(("metadata", "name"), config.peering_name)]


async def test_standalone_the_workers_act_and_post_their_events() -> None:
    """Without peering the workers run from the first resource event to the operator's end, and post
    Events as with peering (kopf's posting queue is in their context)."""
    async with LocalCluster() as cluster:
        await cluster.start_operator(dataclasses.replace(TEST_CONFIG, standalone=True))
        try:
            await cluster.apply_npu_inference(manifest(replicas=0, autoscaling={"maxReplicas": 1}))

            async def warning() -> Any:
                return [e for e in await events(cluster, "tiny-llama") if e["type"] == "Warning"]

            (event,) = await cluster.wait_for(warning)
            assert event["reason"] == "InvalidSpec"
            await cluster.apply_npu_inference(manifest() | {"metadata": {"name": "valid", "namespace": NS}})
            await cluster.wait_for(lambda: child(cluster, "apps/v1", "deployments", "valid"))
        finally:
            await cluster.stop_operator()
        assert not await cluster.get("kopf.dev/v1", "clusterkopfpeerings", None, TEST_CONFIG.peering_name)


async def test_a_replica_with_a_higher_priority_pauses_the_workers_and_its_going_resumes_them(
    operator: LocalCluster,
) -> None:
    """kopf pauses this replica when a peer with a higher priority shows up in the peering object;
    the workers (run by a kopf daemon on that object) then write nothing until it is gone."""
    await operator.apply_npu_inference(manifest())
    await wait_condition(operator, "tiny-llama", "Progressing", "True")
    lastseen = datetime.datetime.now(datetime.UTC).isoformat()
    peer = {"priority": 2**31, "lifetime": 60, "lastseen": lastseen}
    peering = ("kopf.dev/v1", "clusterkopfpeerings", None, TEST_CONFIG.peering_name)
    await operator.patch(*peering, {"status": {"the-other-replica": peer}})
    await asyncio.sleep(2)  # kopf sees the peer and stops the daemon; its stop ends the workers
    writes_before = len(operator.writes())
    # What kopf would tell (a new resource, a label) waits in kopf's paused watch; what our own
    # informers see (a child deleted) would wake a worker that kept acting.
    await operator.apply_npu_inference(manifest() | {"metadata": {"name": "while-paused", "namespace": NS}})
    await operator.patch(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", {"metadata": {"labels": {"team": "a"}}})
    await operator.delete("apps/v1", "deployments", NS, "tiny-llama")
    await asyncio.sleep(3 * TEST_CONFIG.resync_seconds + 1)
    ours = [r for r in operator.writes()[writes_before:] if r.headers.get("User-Agent") == client.USER_AGENT]
    assert [f"{r.method.value} {r.url.path}" for r in ours] == []
    assert await child(operator, "apps/v1", "deployments", "tiny-llama") is None

    await operator.patch(*peering, {"status": {"the-other-replica": None}})  # the other replica is gone
    deployment = await operator.wait_for(lambda: child(operator, "apps/v1", "deployments", "tiny-llama"), within=30)
    assert deployment["metadata"]["labels"].get("team") == "a"
    await operator.wait_for(lambda: child(operator, "apps/v1", "deployments", "while-paused"), within=30)


async def set_nodes(cluster: LocalCluster, nodes: int) -> None:
    layout = {"npu": {"nodes": nodes}, "parallelism": {"data": nodes}}
    await cluster.patch(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", {"spec": layout})


def two_node_manifest() -> dict[str, Any]:
    """The sandbox's CPU resource as a two-node replica: one data-parallel rank per node."""
    document = manifest()
    document["spec"]["npu"] = {"count": 0, "nodes": 2}
    document["spec"]["parallelism"] = {"data": 2}
    return document


async def test_a_multi_node_replica_without_the_lws_api_is_degraded_and_nothing_else_breaks(
    operator: LocalCluster,
) -> None:
    await operator.apply_npu_inference(two_node_manifest())
    obj = await wait_condition(operator, "tiny-llama", "Degraded", "True", "LeaderWorkerSetNotInstalled")
    assert "leaderworkerset.x-k8s.io/v1 API is not installed" in condition(obj, "Degraded")["message"]
    assert await child(operator, "apps/v1", "deployments", "tiny-llama") is None
    # A one-node resource beside it is served as before.
    other = manifest()
    other["metadata"]["name"] = "one-node"
    await operator.apply_npu_inference(other)
    await wait_condition(operator, "one-node", "Progressing", "True")


async def test_a_disaggregated_resource_without_the_disaggregated_set_api_is_degraded_and_nothing_is_built(
    operator: LocalCluster,
) -> None:
    document = manifest()
    document["spec"]["disaggregation"] = {"prefill": {"npu": {"count": 0}}}
    await operator.apply_npu_inference(document)
    obj = await wait_condition(operator, "tiny-llama", "Degraded", "True", "DisaggregatedSetNotInstalled")
    assert "disaggregatedset.x-k8s.io/v1 API is not installed" in condition(obj, "Degraded")["message"]
    assert await child(operator, "apps/v1", "deployments", "tiny-llama") is None, "no router without its engines"
    assert await child(operator, "v1", "services", "tiny-llama") is None


async def test_a_multi_node_replica_is_an_owned_leader_worker_set_collected_with_it() -> None:
    async with LocalCluster(leader_worker_sets=True) as cluster:
        await cluster.start_operator(TEST_CONFIG)
        try:
            created = await cluster.apply_npu_inference(two_node_manifest())

            async def lws() -> Any:
                return await child(cluster, "leaderworkerset.x-k8s.io/v1", "leaderworkersets", "tiny-llama")

            found = await cluster.wait_for(lws, what="the LeaderWorkerSet")
            assert found["spec"]["leaderWorkerTemplate"]["size"] == 2
            assert found["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
            assert await child(cluster, "apps/v1", "deployments", "tiny-llama") is None
            # Play the LeaderWorkerSet controller: the one group is ready.
            await cluster.patch(
                "leaderworkerset.x-k8s.io/v1",
                "leaderworkersets",
                NS,
                "tiny-llama",
                {
                    "status": {
                        "observedGeneration": found["metadata"]["generation"],
                        "replicas": 1,
                        "updatedReplicas": 1,
                        "readyReplicas": 1,
                    }
                },
                subresource="status",
            )
            await wait_condition(cluster, "tiny-llama", "Ready", "True", "Serving")
            # Back to one node: the LeaderWorkerSet gives way to a Deployment.
            await set_nodes(cluster, 1)

            async def swapped() -> bool:
                return await lws() is None and await child(cluster, "apps/v1", "deployments", "tiny-llama") is not None

            await cluster.wait_for(swapped, what="the Deployment in place of the LeaderWorkerSet")
            await set_nodes(cluster, 2)
            await cluster.wait_for(lws, what="the LeaderWorkerSet again")
            await cluster.delete(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama")

            async def all_gone() -> bool:
                return await cluster.get(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama") is None and await lws() is None

            await cluster.wait_for(all_gone, what="the resource and its LeaderWorkerSet")
        finally:
            await cluster.stop_operator()


async def test_a_child_or_spec_change_wakes_the_worker_without_waiting_for_a_resync(cluster: LocalCluster) -> None:
    slow = dataclasses.replace(TEST_CONFIG, resync_seconds=60.0, status_poll_seconds=60.0)
    await cluster.start_operator(slow)
    try:
        await cluster.apply_npu_inference(manifest())
        await wait_condition(cluster, "tiny-llama", "Progressing", "True")
        await asyncio.sleep(0.5)  # the first ticks are over: from now on only a wake-up can act
        started = asyncio.get_running_loop().time()
        await settle_deployment(cluster, "tiny-llama", ready=1)
        await wait_condition(cluster, "tiny-llama", "Ready", "True")
        assert asyncio.get_running_loop().time() - started < 5  # far below the 60 s resync

        await cluster.delete("v1", "services", NS, "tiny-llama")

        async def recreated() -> Any:
            return await child(cluster, "v1", "services", "tiny-llama")

        await cluster.wait_for(recreated, within=5, what="the deleted Service to be put back at once")

        await cluster.patch(crd.API_VERSION, crd.PLURAL, NS, "tiny-llama", {"spec": {"replicas": 2}})

        async def scaled() -> Any:
            deployment = await child(cluster, "apps/v1", "deployments", "tiny-llama")
            return deployment if deployment and deployment["spec"]["replicas"] == 2 else None

        await cluster.wait_for(scaled, within=5, what="a spec change to be applied at once")
    finally:
        await cluster.stop_operator()
