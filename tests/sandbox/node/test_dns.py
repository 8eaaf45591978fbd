"""The sandbox's cluster DNS (`npu_sandbox.node.dns`): what a pod's resolver answers, per the cluster
DNS specification (kubernetes/dns docs/specification.md) and the endpoint controller's rules.
Pure: Services and Pod objects in, records and hosts files out."""

from __future__ import annotations

from typing import Any

from npu_sandbox.node import dns

NS = "llm"


def pod(
    name: str,
    ip: str | None,
    *,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    namespace: str = NS,
    hostname: str | None = None,
    subdomain: str | None = None,
    **meta: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if hostname:
        spec["hostname"] = hostname
    if subdomain:
        spec["subdomain"] = subdomain
    status: dict[str, Any] = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        status["podIP"] = ip
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, **meta},
        "spec": spec,
        "status": status,
    }


def service(
    name: str, selector: dict[str, str], *, headless: bool = False, namespace: str = NS, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"selector": selector, **spec}
    if headless:
        body["clusterIP"] = "None"
    return {"metadata": {"name": name, "namespace": namespace}, "spec": body}


APP = {"app": "r1"}


def test_a_cluster_ip_service_answers_its_ready_pods_and_only_them() -> None:
    pods = [pod("a", "127.9.0.2", labels=APP), pod("b", "127.9.0.3", labels=APP, ready=False), pod("c", "127.9.0.4")]
    records = dns.records([service("r1", APP)], pods)
    # No kube-proxy: the name answers the ready endpoints themselves; no per-pod names for a ClusterIP Service.
    assert records == {"r1.llm.svc.cluster.local": ["127.9.0.2"]}


def test_a_headless_service_names_its_pods_by_hostname_when_their_subdomain_is_the_service() -> None:
    pods = [
        pod("r1-0", "127.9.0.2", labels=APP, hostname="r1-0", subdomain="r1-0"),
        pod("r1-0-1", "127.9.0.3", labels=APP, hostname="r1-0-1", subdomain="r1-0"),
        # Selected, but its subdomain names another Service: an endpoint without a hostname (dashed IP).
        pod("other", "127.9.0.4", labels=APP, hostname="other", subdomain="elsewhere"),
    ]
    records = dns.records([service("r1-0", APP, headless=True)], pods)
    assert records == {
        "127-9-0-4.r1-0.llm.svc.cluster.local": ["127.9.0.4"],
        "r1-0-1.r1-0.llm.svc.cluster.local": ["127.9.0.3"],
        "r1-0.llm.svc.cluster.local": ["127.9.0.2", "127.9.0.3", "127.9.0.4"],
        "r1-0.r1-0.llm.svc.cluster.local": ["127.9.0.2"],
    }


def test_not_ready_pods_are_published_only_when_the_service_says_so() -> None:
    starting = [pod("r1-0", "127.9.0.2", labels=APP, ready=False, hostname="r1-0", subdomain="r1")]
    assert dns.records([service("r1", APP, headless=True)], starting) == {}
    published = dns.records([service("r1", APP, headless=True, publishNotReadyAddresses=True)], starting)
    assert published["r1-0.r1.llm.svc.cluster.local"] == ["127.9.0.2"]


def test_pods_without_an_address_terminating_finished_or_elsewhere_are_no_endpoints() -> None:
    terminating = pod("t", "127.9.0.5", labels=APP, deletionTimestamp="2026-12-06T00:00:00Z")
    finished = pod("f", "127.9.0.6", labels=APP)
    finished["status"]["phase"] = "Succeeded"
    pods = [pod("n", None, labels=APP), terminating, finished, pod("x", "127.9.0.7", labels=APP, namespace="other")]
    assert dns.records([service("r1", APP)], pods) == {}
    # A Service without a selector, or an ExternalName one, has no endpoints here.
    assert dns.records([service("r1", {}), service("r2", APP, type="ExternalName")], [pod("a", "1.2.3.4")]) == {}


def test_every_spelling_the_search_list_completes_and_another_namespace_gets_fewer() -> None:
    fqdn = "r1-0.r1-0.llm.svc.cluster.local"
    assert dns.spellings(fqdn, NS) == [fqdn, "r1-0.r1-0", "r1-0.r1-0.llm", "r1-0.r1-0.llm.svc"]
    assert dns.spellings(fqdn, "other") == [fqdn, "r1-0.r1-0.llm", "r1-0.r1-0.llm.svc"]
    assert dns.spellings("r1.llm.svc.cluster.local", NS) == ["r1.llm.svc.cluster.local", "r1", "r1.llm", "r1.llm.svc"]


def test_lookup_applies_the_search_list_as_a_pods_resolver_does() -> None:
    pods = [pod("r1-0", "127.9.0.2", labels=APP, hostname="r1-0", subdomain="r1-0")]
    cluster = dns.ClusterDns.of([service("r1-0", APP, headless=True), service("api", APP)], pods)
    for name in ("r1-0.r1-0.llm", "r1-0.r1-0", "r1-0.r1-0.llm.svc.cluster.local", "R1-0.r1-0.llm."):
        assert cluster.lookup(name, NS) == ["127.9.0.2"], name
    assert cluster.lookup("api", NS) == cluster.lookup("api.llm.svc", "other") == ["127.9.0.2"]
    assert cluster.lookup("api", "other") == []  # `api` alone is `api.other.svc.cluster.local` there
    assert cluster.lookup("r1-0.r1.llm", NS) == []  # no Service r1: no such name


def test_the_hosts_file_is_the_kubelets_then_the_clusters_answers() -> None:
    leader = pod("r1-0", "127.9.0.2", labels=APP, hostname="r1-0", subdomain="r1-0")
    worker = pod("r1-0-1", "127.9.0.3", labels=APP, hostname="r1-0-1", subdomain="r1-0")
    worker["spec"]["hostAliases"] = [{"ip": "10.0.0.1", "hostnames": ["hub", "hub.local"]}]
    cluster = dns.ClusterDns.of([service("r1-0", APP, headless=True, publishNotReadyAddresses=True)], [leader, worker])
    hosts = cluster.hosts_file(worker)
    assert hosts.startswith(dns.KUBELET_HEADER)
    lines = hosts.splitlines()
    # The kubelet's own line for the pod (managedHostsFileContent), with its aliases.
    assert "127.9.0.3\tr1-0-1.r1-0.llm.svc.cluster.local\tr1-0-1" in lines
    assert "10.0.0.1\thub\thub.local" in lines
    # The leader, in each spelling: `$(LWS_LEADER_ADDRESS)` (`r1-0.r1-0.llm`) among them.
    assert "127.9.0.2\tr1-0.r1-0.llm.svc.cluster.local r1-0.r1-0 r1-0.r1-0.llm r1-0.r1-0.llm.svc" in lines
    # A pod without a subdomain has only its hostname in its own line.
    alone = dns.ClusterDns.of([], []).hosts_file(pod("solo-abc", "127.9.0.9"))
    assert "127.9.0.9\tsolo-abc" in alone.splitlines()


def test_under_shared_the_operators_cluster_ip_service_leaves_the_leader_address_unresolved() -> None:
    """LeaderWorkerSet's Shared policy with the resource's own ClusterIP Service `r1`: LWS makes no
    headless Service (the name is taken), and `r1-0.r1.llm` resolves nowhere, not even in the leader
    (its own kubelet line is the FQDN and the bare hostname, not that spelling)."""
    lws = {"leaderworkerset.sigs.k8s.io/name": "r1"}
    leader = pod("r1-0", "127.9.0.2", labels={**lws, "role": "leader"}, hostname="r1-0", subdomain="r1")
    worker = pod("r1-0-1", "127.9.0.3", labels=lws, hostname="r1-0-1", subdomain="r1")
    cluster = dns.ClusterDns.of([service("r1", {"role": "leader"})], [leader, worker])
    assert cluster.lookup("r1", NS) == ["127.9.0.2"]  # the Service itself answers
    for each in (leader, worker):
        assert "r1-0.r1.llm " not in cluster.hosts_file(each) and "r1-0.r1.llm\n" not in cluster.hosts_file(each)
    assert cluster.lookup("r1-0.r1.llm", NS) == []


def test_the_resolver_files_send_nothing_elsewhere() -> None:
    resolv = dns.resolv_conf(NS, "127.9.0.1")
    assert "search llm.svc.cluster.local svc.cluster.local cluster.local\n" in resolv
    assert "nameserver 127.9.0.1\n" in resolv and "options ndots:5" in resolv
    node = "passwd: files\nhosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\nnetworks: files\n"
    assert dns.nsswitch_conf(node) == "passwd: files\nnetworks: files\nhosts:          files\n"
