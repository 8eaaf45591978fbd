"""Whether any node can run a resource's pods: the NPUs they ask for against what the Nodes offer. Pure.

The ask (`asks`): per role (a P/D resource's prefill role too, `api.roles.role_spec`), the extended
resource its pods request (`api.clusters.npu_resource`, the one place that decides it), the count
per pod and the node labels of CHIP_LABELS their nodeSelector names (the chip of spec.npu.chipName,
the volcano profile's accelerator type). The offer (`Offer`): what each Node's `node_npus` keeps of
it, folded into the distinct node shapes and how many nodes have each, kept by
`controller.watches.NodeOffers` from an informer on Nodes (read-only, cluster-wide, only with the
setting `node_discovery`; docs/operator.md, "What the operator reads of Nodes"). `unmet` says,
when no node has the resource (as many as asked, allocatable) and the labels, what was asked, what
the nodes offer and which setting to change.

What counts as an NPU resource (`is_npu_resource`): every extended resource under `huawei.com/`
(the Ascend device plugin's huawei.com/Ascend910, Ascend310P and their virtual NPUs such as
Ascend910-4c; CCE's huawei.com/ascend-1980 and ascend-310), and any other extended resource (a
name with a domain outside kubernetes.io) whose name looks like an accelerator's (gpu, npu,
ascend, tpu, neuron, mlu, dcu, xpu: nvidia.com/gpu, aws.amazon.com/neuron, google.com/tpu). Only
those are kept of a Node (cpu, memory, pods and hugepages never are), at most MAX_RESOURCES a node;
an ask for a resource outside them is never judged here (the scheduler's verdict on the pods is,
`findings`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from npu_operator.api import clusters, roles
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec

# The node labels kept of every Node, in one place: the label spec.npu.chipName selects on
# (`api.clusters.CHIP_LABEL`, 910B3...), the accelerator type the volcano profile's pods select by
# family (`api.clusters.ACCELERATOR_TYPE_LABEL`, module-910b-8...), CCE's (accelerator/huawei-npu,
# set on NPU nodes that are ready: Huawei Cloud CCE, "NPU Scheduling", NPU node labels) and the
# Ascend device plugin's (accelerator: huawei-Ascend910, huawei-Ascend310P: MindX DL, "kubernetes
# labels"). Of a spec's node selector, these labels are what `unmet` judges.
CHIP_LABELS: Final = (clusters.CHIP_LABEL, clusters.ACCELERATOR_TYPE_LABEL, "accelerator/huawei-npu", "accelerator")
NPU_DOMAIN: Final = "huawei.com/"
_ACCELERATOR: Final = re.compile(r"npu|gpu|ascend|tpu|neuron|mlu|dcu|xpu", re.IGNORECASE)
MAX_RESOURCES: Final = 8  # NPU resources kept of one node
MAX_SHOWN: Final = 6  # entries of the offer a message names; the rest are counted
MAX_VALUE: Final = 63  # a label value's limit (and a resource count's digits, far above any)


def is_npu_resource(name: str) -> bool:
    """Whether `name` is an extended resource kept of the Nodes (see the module's docstring)."""
    domain, slash, _ = name.partition("/")
    if not slash or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    return name.startswith(NPU_DOMAIN) or _ACCELERATOR.search(name) is not None


@dataclasses.dataclass(frozen=True)
class NodeNPUs:
    """What one Node offers of NPUs: its NPU resources' allocatable counts and its chip labels, sorted."""

    resources: tuple[tuple[str, int], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def count(self, resource: str) -> int | None:
        return next((count for name, count in self.resources if name == resource), None)

    def label(self, key: str) -> str | None:
        return next((value for name, value in self.labels if name == key), None)


def node_npus(node: Mapping[str, Any]) -> NodeNPUs:
    """The part of a Node that `unmet` reads: status.allocatable of its NPU resources (an integer
    quantity each, as extended resources are), and its chip labels (CHIP_LABELS)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    resources: list[tuple[str, int]] = []
    for name, quantity in allocatable.items():
        if isinstance(name, str) and is_npu_resource(name) and len(resources) < MAX_RESOURCES:
            text = str(quantity).strip()
            if text.isdigit() and len(text) <= 9:
                resources.append((sys.intern(name), int(text)))  # one copy of each name for every node
    labels = (node.get("metadata") or {}).get("labels") or {}
    chips = [(key, sys.intern(str(labels[key])[:MAX_VALUE])) for key in CHIP_LABELS if key in labels]
    return NodeNPUs(tuple(sorted(resources)), tuple(sorted(chips)))


@dataclasses.dataclass(frozen=True)
class Offer:
    """What the listed Nodes offer: each distinct node shape and how many nodes have it."""

    nodes: int = 0
    shapes: tuple[tuple[NodeNPUs, int], ...] = ()

    @classmethod
    def of(cls, nodes: Iterable[NodeNPUs]) -> Offer:
        counted = Counter(nodes)
        shapes = sorted(counted.items(), key=lambda item: (-item[1], item[0].resources, item[0].labels))
        return cls(sum(counted.values()), tuple(shapes))


@dataclasses.dataclass(frozen=True)
class Ask:
    """What one role's pods ask of a node: `count` of the extended resource `resource`, on a node with
    the labels `selector` (those of CHIP_LABELS their nodeSelector names: the chip, the accelerator
    type); `role` names a P/D role ("" otherwise)."""

    resource: str
    count: int
    selector: tuple[tuple[str, str], ...] = ()
    role: str = ""
    profile: str = ""  # the operator's cluster profile (npu.clusterProfile), for the hint

    @property
    def text(self) -> str:
        """ "role prefill asks huawei.com/Ascend910: 8 per pod on node.kubernetes.io/npu.chip.name=910B3"."""
        who = f"role {self.role} asks" if self.role else "asks"
        count = f": {self.count} per pod" if self.count > 0 else ""
        on = " on " + ", ".join(f"{key}={value}" for key, value in self.selector) if self.selector else ""
        return f"{who} {self.resource}{count}{on}"


def asks(spec: NPUInferenceSpec, config: OperatorConfig) -> tuple[Ask, ...]:
    """Each role's ask (the decode role's is the resource's own; a role asking no NPU has none), with
    the node labels its pods select on as `children.engine_pod` writes them: spec.template's, the
    chip (spec.npu.chipName), the profile's accelerator type for the spec's family unless set."""
    profile = clusters.profile(config)
    specs = [("prefill", roles.role_spec(spec, "prefill")), ("decode", spec)] if spec.disaggregation else [("", spec)]
    found = []
    for role, one in specs:
        if one.npu.count <= 0:
            continue
        selector = {key: str(value) for key, value in one.template.node_selector.items() if key in CHIP_LABELS}
        if one.npu.chip_name:
            selector[clusters.CHIP_LABEL] = one.npu.chip_name
        if accelerator_type := profile.accelerator_types.get(clusters.spec_family(one)):
            selector.setdefault(clusters.ACCELERATOR_TYPE_LABEL, accelerator_type)
        resource = clusters.npu_resource(one, config)
        found.append(Ask(resource, one.npu.count, tuple(sorted(selector.items())), role, config.cluster_profile))
    return tuple(found)


def fits(shape: NodeNPUs, ask: Ask) -> bool:
    count = shape.count(ask.resource)
    return count is not None and count >= ask.count and all(shape.label(k) == v for k, v in ask.selector)


def unmet(ask: Ask, offer: Offer) -> str | None:
    """Why no listed node can run a pod of `ask`, naming what the nodes offer; None when one can, when
    no node was listed, or when the ask is not an NPU resource (`is_npu_resource`): not known here."""
    if offer.nodes == 0 or ask.count <= 0 or not is_npu_resource(ask.resource):
        return None
    if any(fits(shape, ask) for shape, _ in offer.shapes):
        return None
    offered = _offered(offer)
    with_resource = [(shape, n) for shape, n in offer.shapes if shape.count(ask.resource) is not None]
    enough = [(shape, n) for shape, n in with_resource if (shape.count(ask.resource) or 0) >= ask.count]
    if not with_resource:
        hint = _resource_hint(ask, offered)
    elif not enough:
        most = max(shape.count(ask.resource) or 0 for shape, _ in with_resource)
        hint = (
            f"no node has {ask.count}: ask at most {most} per pod (spec.npu.count, with parallelism to match), "
            "or spread a replica over more nodes (spec.npu.nodes)"
        )
    else:
        hint = _label_hint(ask, enough)
    return f"{ask.text}; the nodes offer {_offer_text(offered, offer.nodes)}; {hint}"


def _label_hint(ask: Ask, enough: Sequence[tuple[NodeNPUs, int]]) -> str:
    """The first label of the ask that no node with enough of the resource has, and theirs."""
    key, value = next(
        ((k, v) for k, v in ask.selector if not any(shape.label(k) == v for shape, _ in enough)), ask.selector[0]
    )
    values = Counter(shape.label(key) or "none" for shape, n in enough for _ in range(n))
    shown = ", ".join(f"{label} ({_nodes(n)})" for label, n in sorted(values.items())[:MAX_SHOWN])
    how = (
        "set spec.npu.chipName to one of them, or remove it"
        if key == clusters.CHIP_LABEL
        else f"label the NPU nodes {key}, or select one of theirs in spec.template.nodeSelector"
    )
    return f"no node with {ask.count} {ask.resource} has {key}={value}; theirs: {shown}: {how}"


def _offered(offer: Offer) -> dict[str, tuple[int, int]]:
    """NPU resource -> (nodes that offer it, the most one node allocates)."""
    offered: dict[str, tuple[int, int]] = {}
    for shape, n in offer.shapes:
        for name, count in shape.resources:
            nodes, most = offered.get(name, (0, 0))
            offered[name] = (nodes + n, max(most, count))
    return offered


def _offer_text(offered: Mapping[str, tuple[int, int]], nodes: int) -> str:
    if not offered:
        return f"no NPU resource ({_nodes(nodes)} listed)"
    ranked = sorted(offered.items(), key=lambda item: (-item[1][0], item[0]))
    shown = ", ".join(f"{name} ({_nodes(n)}, up to {most})" for name, (n, most) in ranked[:MAX_SHOWN])
    more = len(ranked) - MAX_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _resource_hint(ask: Ask, offered: Mapping[str, tuple[int, int]]) -> str:
    """Which setting names a resource the nodes offer: the spec's, the operator's, or a cluster profile."""
    profiles = [
        name
        for name, profile in clusters.PROFILES.items()
        if name != ask.profile and any(resource in offered for resource in profile.resources.values())
    ]
    by_profile = f" / npu.clusterProfile={profiles[0]}" if profiles else ""
    return f"set spec.npu.resourceName or the chart's operator.npuResourceName{by_profile}"


def _nodes(n: int) -> str:
    return f"{n} node" + ("s" if n != 1 else "")


def first_unmet(asks: Sequence[Ask], offer: Offer | None) -> str | None:
    """The first role's `unmet` message ("; "-joined when both roles' asks are unmet), None when all fit."""
    if offer is None:
        return None
    found = [why for ask in asks if (why := unmet(ask, offer)) is not None]
    return "; ".join(found) or None
