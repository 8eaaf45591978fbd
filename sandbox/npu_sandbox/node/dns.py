"""Cluster DNS for the sandbox's pods, as files: what a pod's resolver would answer, per pod.

Pure: Services and Pod objects in, the text of each pod's `/etc/hosts` (and its `/etc/resolv.conf`,
`/etc/nsswitch.conf`) out. The kubelet (`npu_sandbox.node.kubelet`) bind-mounts them into each
pod's own mount namespace and rewrites the hosts file in place whenever its text changes.

The records follow Kubernetes' "DNS for Services and Pods" (the cluster DNS specification,
kubernetes/dns docs/specification.md, which CoreDNS's kubernetes plugin implements), for the
cluster domain `cluster.local`:

- a Service with a selector: `<service>.<namespace>.svc.cluster.local` answers the addresses of
  its endpoints: the pods in its namespace whose labels match its selector, that have an IP and
  are not terminating, and are Ready, or any of them when the Service sets
  `publishNotReadyAddresses` (the endpoint controller's rules);
- a headless Service (`clusterIP: None`) also answers, per endpoint,
  `<hostname>.<service>.<namespace>.svc.cluster.local` for a pod whose `spec.hostname` is set and
  whose `spec.subdomain` is the Service's name (the endpoint gets the pod's hostname: that is how
  a StatefulSet's or LeaderWorkerSet's pod gets a name), and `<a-b-c-d>.<service>...` (its IP,
  dashed) for any other endpoint;
- nothing else: a pod's `hostname.subdomain` name without a headless Service of that name that
  selects it does not resolve anywhere but in that pod itself (below).

Each pod's own file starts as the kubelet writes a pod's `/etc/hosts` (pkg/kubelet/kubelet_pods.go
`managedHostsFileContent`): localhost, then `<pod IP> <hostname>.<subdomain>.<namespace>.svc.cluster.local <hostname>`
(or only `<hostname>` without a subdomain), then spec.hostAliases. Then the cluster's records,
each in every spelling that the pod's search list (`<namespace>.svc.cluster.local svc.cluster.local
cluster.local`, ndots 5: the kubelet's resolv.conf for ClusterFirst) completes to it: a hosts file
is matched exactly, with no search list, so `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc` and the full
name are all written (the first only for pods of the Service's own namespace).

What differs from a cluster, on purpose: there is no kube-proxy, so a ClusterIP Service's name
answers its ready endpoints' pod addresses, not a virtual IP: a client reaches the Service's
`port` on a pod, which is right only when `port` equals the `targetPort` (it does for every
Service the operator makes: 8000 -> http (8000), 9090 -> metrics (9090)). A ClusterIP Service
without ready endpoints has no address here (on a cluster its name resolves and connections are
refused). Not emulated: ExternalName Services (CNAMEs), SRV records, `<ip>.<ns>.pod.cluster.local`
names, a pod's `setHostnameAsFQDN`, dnsPolicy and dnsConfig other than ClusterFirst.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

CLUSTER_DOMAIN: Final = "cluster.local"
HOSTNAME_MAX: Final = 63  # a pod's hostname is its name cut to 63 characters (kubelet GeneratePodHostNameAndDomain)
# The kubelet's own lines (managedHostsFileContent), before the pod's.
KUBELET_HEADER: Final = (
    "# Kubernetes-managed hosts file.\n"
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "fe00::0\tip6-mcastprefix\n"
    "fe00::1\tip6-allnodes\n"
    "fe00::2\tip6-allrouters\n"
)
CLUSTER_HEADER: Final = "# The cluster DNS's answers for this pod (npu-sandbox: no DNS server, this file is it).\n"

JSON = dict[str, Any]


def search_list(namespace: str) -> tuple[str, ...]:
    """A ClusterFirst pod's search domains (the kubelet's resolv.conf), most specific first."""
    return (f"{namespace}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN)


def spellings(fqdn: str, namespace: str) -> list[str]:
    """Every name a pod in `namespace` can look up that its search list completes to `fqdn`, `fqdn` first."""
    names = [fqdn]
    for domain in search_list(namespace):
        if fqdn.endswith("." + domain):
            names.append(fqdn[: -len(domain) - 1])
    return names


def pod_hostname(pod: Mapping[str, Any]) -> str:
    """spec.hostname, else the pod's name (cut to 63 characters), as the kubelet sets it."""
    return str(pod.get("spec", {}).get("hostname") or pod["metadata"]["name"][:HOSTNAME_MAX])


def pod_ip(pod: Mapping[str, Any]) -> str | None:
    found = pod.get("status", {}).get("podIP")
    return str(found) if found else None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", ())
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _selects(service: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    selector: Mapping[str, str] = service.get("spec", {}).get("selector") or {}
    if not selector or pod["metadata"].get("namespace") != service["metadata"].get("namespace"):
        return False
    labels: Mapping[str, str] = pod["metadata"].get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def endpoints(service: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods the Service's endpoints hold, as the endpoint controller picks them: selected, with an
    IP, not terminating nor finished; Ready, unless the Service publishes not-ready addresses."""
    publish = bool(service.get("spec", {}).get("publishNotReadyAddresses"))
    return [
        pod
        for pod in pods
        if _selects(service, pod)
        and pod_ip(pod)
        and not pod["metadata"].get("deletionTimestamp")
        and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        and (publish or pod_ready(pod))
    ]


def headless(service: Mapping[str, Any]) -> bool:
    return bool(service.get("spec", {}).get("clusterIP") == "None")


def records(services: Iterable[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The cluster DNS's A records: fully qualified name -> addresses (sorted, each once)."""
    found: dict[str, set[str]] = {}
    for service in services:
        meta = service["metadata"]
        if service.get("spec", {}).get("type") == "ExternalName":
            continue
        zone = f"{meta['name']}.{meta['namespace']}.svc.{CLUSTER_DOMAIN}"
        for pod in endpoints(service, pods):
            address = pod_ip(pod)
            assert address is not None
            found.setdefault(zone, set()).add(address)
            if not headless(service):
                continue
            spec = pod.get("spec", {})
            if spec.get("hostname") and spec.get("subdomain") == meta["name"]:
                found.setdefault(f"{spec['hostname']}.{zone}", set()).add(address)
            else:
                found.setdefault(f"{address.replace('.', '-')}.{zone}", set()).add(address)
    return {name: sorted(addresses) for name, addresses in sorted(found.items())}


def own_lines(pod: Mapping[str, Any]) -> str:
    """The kubelet's lines for the pod itself (managedHostsFileContent), hostAliases included."""
    address = pod_ip(pod)
    hostname = pod_hostname(pod)
    spec = pod.get("spec", {})
    lines = []
    if address:
        if spec.get("subdomain"):
            fqdn = f"{hostname}.{spec['subdomain']}.{pod['metadata']['namespace']}.svc.{CLUSTER_DOMAIN}"
            lines.append(f"{address}\t{fqdn}\t{hostname}")
        else:
            lines.append(f"{address}\t{hostname}")
    aliases = [a for a in spec.get("hostAliases") or () if a.get("ip") and a.get("hostnames")]
    if aliases:
        lines.append("\n# Entries added by HostAliases.")
        lines += [f"{alias['ip']}\t{chr(9).join(alias['hostnames'])}" for alias in aliases]
    return "".join(line + "\n" for line in lines)


@dataclasses.dataclass(frozen=True)
class ClusterDns:
    """The cluster DNS at one moment: built from every Service and Pod of the cluster (all namespaces)."""

    records: Mapping[str, Sequence[str]]

    @classmethod
    def of(cls, services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> ClusterDns:
        return cls(records(services, list(pods)))

    def lookup(self, name: str, namespace: str) -> list[str]:
        """What a pod of `namespace` gets for `name` (the search list applied, as its resolver would)."""
        name = name.rstrip(".").lower()
        candidates = [f"{name}.{domain}" for domain in search_list(namespace)]
        if name.count(".") >= 5:  # ndots 5: absolute first
            candidates.insert(0, name)
        else:
            candidates.append(name)
        return next((list(self.records[c]) for c in candidates if c in self.records), [])

    def hosts_file(self, pod: Mapping[str, Any]) -> str:
        """The pod's /etc/hosts: the kubelet's lines, then every record in each spelling its search list completes."""
        namespace = pod["metadata"]["namespace"]
        lines = [
            f"{address}\t{' '.join(spellings(name, namespace))}"
            for name, addresses in self.records.items()
            for address in addresses
        ]
        return KUBELET_HEADER + own_lines(pod) + "\n" + CLUSTER_HEADER + "".join(line + "\n" for line in lines)


def resolv_conf(namespace: str, nameserver: str) -> str:
    """The pod's /etc/resolv.conf: a ClusterFirst pod's search list and ndots, and a nameserver at which
    nothing answers, so that a resolver reading this file directly (not glibc's, which the
    nsswitch.conf keeps to the hosts file) fails at once on any name the hosts file lacks."""
    return (
        "# npu-sandbox: the cluster DNS is this pod's /etc/hosts; nothing answers at this nameserver.\n"
        f"search {' '.join(search_list(namespace))}\n"
        f"nameserver {nameserver}\n"
        "options ndots:5 timeout:1 attempts:1\n"
    )


def nsswitch_conf(host: str) -> str:
    """This machine's nsswitch.conf with its `hosts:` line `files` only: a name the pod's /etc/hosts does
    not hold is unknown ("Name or service not known"), as a cluster DNS answers NXDOMAIN; no
    resolver of this machine (DNS, mDNS, systemd-resolved, myhostname) is asked."""
    lines = [line for line in host.splitlines() if not line.strip().startswith("hosts:")]
    return "\n".join([*lines, "hosts:          files"]) + "\n"
