"""The sandbox's pod network: an address per pod on this machine's loopback, and the cluster's DNS view.

On Linux all of 127.0.0.0/8 is the loopback interface: a process can bind 127.5.0.7 and another
reach it there, with no setup. Each cluster (one `PodNetwork` per API client, `PodNetwork.of`)
claims a /16 of it, `127.N.0.0/16` with N random in 1..254, by binding `127.N.0.1` on a fixed
port: a second sandbox on this machine (tests run several at once) fails that bind and draws
another N. `127.N.0.1` is also the pods' nameserver, where nothing answers (see `dns.resolv_conf`).
Each pod gets the next free address from `127.N.0.2` on, once (a deleted pod's address is not
given again while the cluster lives), and its processes bind it: two pods can both listen on port
8000, as in a cluster.

This machine's other processes (the API, Prometheus, the local hub) stay on 127.0.0.1; a pod
reaches them there, as a pod reaches a node's host port.

The DNS view: every kubelet of the cluster (one per namespace) publishes the Services and Pods it
read in its round (`publish`), and the cluster's DNS is built from all of them (`dns`): a pod
resolves Services of other namespaces as on a cluster.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import random
import socket
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

from npu_sandbox.node.dns import ClusterDns

LOCAL_IP: Final = "127.0.0.1"  # this machine's own processes: the API, Prometheus, the local hub
CLAIM_PORT: Final = 65535  # bound on a cluster's first address while it holds its range (outside the ephemeral range)
FIRST_POD: Final = 2  # 127.N.0.2 is the first pod's


def free_port(host: str = LOCAL_IP) -> int:
    """A port nothing listens on at `host` now (for this machine's own servers, and mapped container ports)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class NoAddress(Exception):
    """No free range in 127.0.0.0/8, or a range has no address left."""


class PodNetwork:
    """One cluster's addresses and its DNS view; `PodNetwork.of(cluster)` is the cluster's."""

    _by_cluster: ClassVar[weakref.WeakKeyDictionary[object, PodNetwork]] = weakref.WeakKeyDictionary()

    def __init__(self, rng: random.Random | None = None) -> None:
        draw = rng or random.SystemRandom()
        candidates = list(range(1, 255))
        draw.shuffle(candidates)
        self._claim: socket.socket | None = None
        for second in candidates:
            claim = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                claim.bind((f"127.{second}.0.1", CLAIM_PORT))
            except OSError as exc:
                claim.close()
                if exc.errno == errno.EADDRINUSE:
                    continue
                raise NoAddress(f"cannot bind 127.{second}.0.1 on this machine's loopback: {exc}") from exc
            self._claim = claim
            self.network = ipaddress.IPv4Network(f"127.{second}.0.0/16")
            break
        else:
            raise NoAddress("every 127.N.0.0/16 (N 1..254) is held by another sandbox on this machine")
        self.nameserver = str(self.network.network_address + 1)
        self._next = FIRST_POD
        self.addresses: dict[str, str] = {}  # pod uid -> its address
        self._views: dict[str, tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]] = {}

    @classmethod
    def of(cls, cluster: object) -> PodNetwork:
        """The network of `cluster` (made on first use, released with it)."""
        found = cls._by_cluster.get(cluster)
        if found is None:
            found = cls._by_cluster[cluster] = cls()
        return found

    def address(self, uid: str) -> str:
        """The pod's address: the next one of the range that can be bound now (once per pod uid)."""
        if uid in self.addresses:
            return self.addresses[uid]
        while self._next < self.network.num_addresses - 1:
            candidate = str(self.network.network_address + self._next)
            self._next += 1
            with socket.socket() as probe:
                try:
                    probe.bind((candidate, 0))
                except OSError:
                    continue  # held by a process that outlived an earlier run: the next one
            self.addresses[uid] = candidate
            return candidate
        raise NoAddress(f"no address left in {self.network}")

    def publish(self, namespace: str, services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> None:
        """A namespace's Services and Pods as its kubelet read them; pods this network addressed get
        their address even before their status says so (the kubelet writes it as they start)."""
        known = []
        for pod in pods:
            address = self.addresses.get(pod["metadata"].get("uid", ""))
            if address and pod.get("status", {}).get("podIP") != address:
                pod = {**pod, "status": {**pod.get("status", {}), "podIP": address, "podIPs": [{"ip": address}]}}
            known.append(pod)
        self._views[namespace] = (list(services), known)

    def dns(self) -> ClusterDns:
        """The cluster DNS over every namespace published so far."""
        services = [s for found, _ in self._views.values() for s in found]
        pods = [p for _, found in self._views.values() for p in found]
        return ClusterDns.of(services, pods)

    def close(self) -> None:
        """Give the range back (also when the network is garbage-collected)."""
        if self._claim is not None:
            with contextlib.suppress(OSError):
                self._claim.close()
            self._claim = None
