"""The writes of a reconcile: server-side apply of a child, its delete, the shared cache's claim, and
which optional APIs the server offers. Every API failure ends in a retry or in status.

A child the watch has not seen is created by an unforced apply, so that an object of someone else
under its name answers 409 (and is reported, left alone: `ForeignChild`) instead of being taken over.
"""

from __future__ import annotations

import asyncio
from typing import Any

from npu_operator.children import kinds as children
from npu_operator.children.kinds import ChildKind, Step
from npu_operator.kube.client import PERSISTENT_VOLUME_CLAIMS, ApiError, KubeClient
from npu_operator.status.reports import one_line

JSON = dict[str, Any]


_OPTIONAL: tuple[ChildKind, ...] = tuple(kind for kind in children.KINDS if kind.optional)


async def served_kinds(client: KubeClient) -> tuple[frozenset[str], dict[str, str]]:
    """The optional kinds whose API the server offers (asked at most once per discovery interval),
    and why for those it would not even say (a 403 on discovery): never a reason to block the rest."""
    served: list[str] = []
    refused: dict[str, str] = {}
    known: dict[ChildKind, bool | BaseException | None] = {kind: client.served_now(kind.resource) for kind in _OPTIONAL}
    unknown = [kind for kind, answer in known.items() if answer is None]
    # Asked together: a resource's first reconcile waits for one round trip, not one per API.
    # Those known (nearly every tick) cost no task.
    if unknown:
        asked = await asyncio.gather(*(client.serves(kind.resource) for kind in unknown), return_exceptions=True)
        known.update(zip(unknown, asked, strict=True))
    for kind, answer in known.items():
        if isinstance(answer, ApiError) and not answer.transient:
            refused[kind.kind] = f"the {kind.resource.api_version} API cannot be used: {api_message(answer)}"
        elif isinstance(answer, BaseException):
            raise answer
        elif answer:
            served.append(kind.kind)
    return frozenset(served), refused


async def ensure_cache_claim(client: KubeClient, namespace: str, claim: JSON) -> None:
    """Create the shared model cache's claim when it is missing; never change or delete one that exists
    (other resources share it, and a bound claim's spec is immutable). Unforced: one made meanwhile
    by someone else answers 409 and is left alone (retried, then found)."""
    if await client.get(PERSISTENT_VOLUME_CLAIMS, namespace, claim["metadata"]["name"]) is None:
        await client.apply(PERSISTENT_VOLUME_CLAIMS, namespace, claim, force=False)


def api_message(exc: ApiError) -> str:
    """The API server's answer in one bounded line: status, reason and its message."""
    return one_line(f"{exc.status} {exc.reason}: {exc.message}")


class ForeignChild(Exception):
    """A child we would create exists already and belongs to someone else: it is left alone."""


async def execute(step: Step, client: KubeClient, namespace: str, uid: str) -> JSON | None:
    resource = step.child.resource
    if step.action == "delete":
        await client.delete(resource, namespace, step.name)
        return None
    assert step.body is not None
    if step.action == "apply":
        return await client.apply(resource, namespace, step.body)
    # create: the watch has not seen it. Unforced, so that an object of someone else under this
    # name answers 409 instead of being taken over; only then is it worth a GET.
    try:
        return await client.apply(resource, namespace, step.body, force=False)
    except ApiError as exc:
        if exc.status != 409:
            raise
    existing = await client.get(resource, namespace, step.name)
    if existing is not None and not children.owned_by(existing, uid):
        raise ForeignChild(step.name)
    return await client.apply(resource, namespace, step.body)
