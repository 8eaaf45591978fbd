"""A branch or tag is resolved once per rollout: every replica of a rollout fetches one commit. Pure.

A hub source that names a branch or a tag (or nothing: the hub's main branch) would otherwise be
resolved by each pod when it starts, so two replicas could serve two commits once the branch
moves. Instead:

1. A *rollout* is the pod template as the spec writes it (the revision as requested) plus the
   value of the resource's `inference.npu.dev/resolve-revision` annotation; `Rollout.key` hashes
   both, and the workload's pod template carries the key as a label (`ROLLOUT_LABEL`). A replicas
   change (scale-out, autoscaling, a restart) is the same rollout; a change of what the pods run,
   or a new annotation value, is a new one.
2. Until its commit is known, a rollout's pods fetch the branch with `--hold`: each fetch resolves
   it on the hub, reports the commit on its `/status` (and downloads), and then holds the pod in its
   init container: no engine ever serves a commit that only one pod resolved.
3. `resolve` takes the commit the first of those pods (by name) reports, checks that it is a
   commit (40 hex digits, as both hubs answer; the runtime checked it already, the operator does
   not trust its pods either), and records it in `status.model.resolved` with the rollout's key,
   the revision asked for, the pod and the time. From the next reconcile on, the pod template is
   built with that commit as the revision (`for_rollout`): every replica of the rollout, including the
   ones scale-out and restarts create later, fetches exactly it, and the runtime checks that the hub
   names that same commit for it. The holding pods are replaced by the Deployment's rollout (the
   download they started goes on in the shared cache).
4. A rollout is resolved once: its key does not depend on the commit, so pinning changes no key
   and cannot loop, and a branch that moves on the hub changes nothing until the spec or the
   annotation does.

Why the pods resolve and not the operator (no egress from the operator, no read access to token
Secrets, no request from the operator's network to an endpoint a resource names): docs/security.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.fetch.listing import is_commit

from npu_operator.api.crd import GROUP
from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.kube.names import FETCH_CONTAINER_NAME
from npu_operator.status.findings import PodReport
from npu_operator.status.model import fetch_result
from npu_operator.status.reports import one_line

JSON = dict[str, Any]

# Set it (to any new value) on an NPUInference to resolve its branch or tag again: a new rollout.
RESOLVE_ANNOTATION: Final = f"{GROUP}/resolve-revision"
# On the pod template: the rollout the pod belongs to (Rollout.key).
ROLLOUT_LABEL: Final = f"{GROUP}/revision-rollout"
REVISION_UNRESOLVED: Final = "RevisionUnresolved"  # Degraded: the pods reported no usable commit
REVISION_RESOLVED: Final = "RevisionResolved"  # Event: a rollout's commit is pinned
_DEFAULT_BRANCH: Final = {"huggingface": "main", "modelscope": "master"}  # the runtime's Hub.default_revision


@dataclasses.dataclass(frozen=True)
class Rollout:
    """The rollout a hub source's branch or tag is resolved for, and its commit once known."""

    key: str  # 16 hex digits: the pod template as written plus the annotation's value
    revision: str  # the branch or tag asked for (the hub's main branch when none)
    commit: str | None  # pinned for this rollout (status.model.resolved), None while resolving


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What `resolve` decided: `status.model.resolved`, and why nothing could be pinned, if so."""

    resolved: JSON | None
    problem: tuple[str, str] | None = None


def rollout(body: Mapping[str, Any], spec: NPUInferenceSpec, children: Sequence[Mapping[str, Any]]) -> Rollout | None:
    """The rollout of `body`, whose `children` were built from `spec` as written; None when there is
    nothing to resolve (a volume source, or a revision that is a commit already)."""
    hub = spec.model.hub
    if hub is None or (hub.revision is not None and is_commit(hub.revision)):
        return None
    request, resolved_for, commit = cache_key(body)
    templates = [template for child in children for template in fetching_templates(child)]
    text = json.dumps([templates, request], sort_keys=True, separators=(",", ":"))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    pinned = commit if resolved_for == key and is_commit(commit) else None
    return Rollout(key, hub.revision or _DEFAULT_BRANCH[hub.hub], pinned)


def cache_key(body: Mapping[str, Any]) -> tuple[str, str, str]:
    """What `rollout` reads besides the spec: the annotation, and the rollout and commit recorded as
    resolved ("" where absent; the CRD's status schema types them as strings)."""
    request = ((body.get("metadata") or {}).get("annotations") or {}).get(RESOLVE_ANNOTATION, "")
    resolved = ((body.get("status") or {}).get("model") or {}).get("resolved") or {}
    return str(request), str(resolved.get("rollout", "")), str(resolved.get("commit", ""))


def for_rollout(spec: NPUInferenceSpec, current: Rollout) -> NPUInferenceSpec:
    """`spec` as the rollout's pods fetch it: the pinned commit as the revision, or, until it is known,
    the branch with `--hold` (the fetch reports the commit and never lets the engine start on it)."""
    hub = spec.model.hub
    assert hub is not None
    fetched = (
        dataclasses.replace(hub, revision=current.commit)
        if current.commit is not None
        else dataclasses.replace(hub, hold=True)
    )
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, hub=fetched))


def fetching_templates(manifest: Any) -> list[JSON]:
    """The pod templates inside a manifest that fetch the model: wherever the workload keeps them
    (a Deployment's `template`, a LeaderWorkerSet's `leaderTemplate`/`workerTemplate`, a kind added later)."""
    if isinstance(manifest, list):
        return [template for item in manifest for template in fetching_templates(item)]
    if not isinstance(manifest, dict):
        return []
    spec = manifest.get("spec")
    init = spec.get("initContainers") if isinstance(spec, dict) else None
    if isinstance(init, list) and any(isinstance(c, dict) and c.get("name") == FETCH_CONTAINER_NAME for c in init):
        return [manifest]
    return [template for value in manifest.values() for template in fetching_templates(value)]


def label(children: Sequence[JSON], key: str) -> None:
    """Marks every fetching pod template with the rollout's key (in place)."""
    for child in children:
        for template in fetching_templates(child):
            labels = template.setdefault("metadata", {}).setdefault("labels", {})
            labels[ROLLOUT_LABEL] = key
            template["metadata"]["labels"] = {name: labels[name] for name in sorted(labels)}


def resolve(
    current: Rollout | None,
    repository: str,
    pods: Sequence[Mapping[str, Any]],
    reports: Sequence[PodReport],
    previous: Mapping[str, Any] | None,
    now: str,
) -> Resolution:
    """`status.model.resolved` for the current rollout: kept once pinned, else taken from the first pod
    of this rollout (by name) that reports a commit of `repository`."""
    if current is None:
        return Resolution(None)
    base: JSON = {"revision": current.revision, "rollout": current.key}
    if current.commit is not None:
        kept = dict(previous or {})
        return Resolution(kept if kept.get("commit") == current.commit else {**base, "commit": current.commit})
    by_pod = {r.pod: r.report.model for r in reports if r.report is not None and r.report.model is not None}
    refused: list[str] = []
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        name = str(pod["metadata"]["name"])
        if (pod["metadata"].get("labels") or {}).get(ROLLOUT_LABEL) != current.key:
            continue  # a pod of an earlier rollout: what it resolved is not this rollout's answer
        answers = [m for m in (fetch_result(pod), by_pod.get(name)) if m is not None and m.repository == repository]
        commit = next((m.revision for m in answers if m.revision), None)
        if commit is None:
            continue
        if not is_commit(commit):
            refused.append(f"pod {name} reported {one_line(commit)[:80]!r}")
            continue
        return Resolution({**base, "commit": commit, "pod": name, "resolvedAt": now})
    if refused:
        message = (
            f"{repository}@{current.revision}: {'; '.join(refused)}, which is not a commit (40 hex digits); "
            f"nothing is pinned (set a commit as the revision, or a new {RESOLVE_ANNOTATION} annotation to retry)"
        )
        return Resolution(base, (REVISION_UNRESOLVED, message))
    return Resolution(base)


def resolution_events(previous: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(reason, message) of a Normal Event when a rollout's commit is newly pinned."""
    old, now = previous or {}, new or {}
    if not now.get("commit") or (old.get("rollout"), old.get("commit")) == (now.get("rollout"), now.get("commit")):
        return []
    where = f" (reported by pod {now['pod']})" if now.get("pod") else ""
    message = (
        f"{now.get('revision')} resolved to commit {now['commit']}{where}; every replica of this rollout fetches it"
    )
    return [(REVISION_RESOLVED, message)]
