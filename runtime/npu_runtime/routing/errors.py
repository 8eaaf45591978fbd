"""How a request ends short of an engine's answer passed on: the exceptions the handler turns
into the client's answer (`Router.handle`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

    from npu_runtime.routing import trust


class Failure(Exception):
    """A call to an engine that failed; what the client gets if no other engine answers.

    `retry`: another engine of the role may succeed. `eject`: the engine is taken out.
    `reached`: the engine may have seen the request (a decode retry then prefills again).
    `body`: the engine's own answer, which the client gets (as JSON) when no other engine answers.
    """

    def __init__(
        self,
        role: str,
        status: int,
        reason: str,
        message: str,
        *,
        retry: bool,
        eject: bool,
        reached: bool = True,
        body: bytes | None = None,
    ) -> None:
        super().__init__(f"{role} engine {message}")
        self.role, self.status, self.reason = role, status, reason
        self.retry, self.eject, self.reached, self.body = retry, eject, reached, body


class Answer(Exception):
    """An engine's own error answer (4xx, 500, ...): passed to the client as JSON."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"engine answered {status}")
        self.status, self.body = status, body


class Reply(Exception):
    """The router's own answer to the client (a bad request, the router full)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers


class ClientGone(Exception):
    """The client closed its connection: not an engine's failure. `response`: the answer it had started."""

    def __init__(self, response: web.StreamResponse | None = None) -> None:
        super().__init__("the client went away")
        self.response = response


def no_engine(role: str) -> Failure:
    """The role has no engine left to try."""
    return Failure(role, 503, "unavailable", "has no engine to send to", retry=False, eject=False)


def router_full(budget: trust.ByteBudget) -> Reply:
    """The router holds all the bytes it may (503: the client may retry)."""
    message = f"the router holds {budget.used} bytes of requests, its limit (--max-buffered-bytes)"
    return Reply(503, "router_full", message, {"Retry-After": "1"})
