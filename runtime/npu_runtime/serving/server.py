"""The runtime's HTTP endpoints on the metrics port: /metrics, /status, /healthz, /readyz.

The standard library's ThreadingHTTPServer in a daemon thread: the runtime's main thread is a
plain process supervisor (signals, a child process, a poll loop) with no event loop to share;
these endpoints are scraped every few seconds and each request reads a few small files, so a
thread per request is plenty; and it adds no dependency to the engine image. /readyz asks the
engine's /health on every call (with a short timeout), so readiness follows the engine exactly.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from npu_runtime import metrics
from npu_runtime.serving.status import RuntimeStatus

HEALTH_TIMEOUT_SECONDS = 2.0


def address_family(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address ("::", "::1": it has a colon), else AF_INET (names, IPv4, "")."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listening_socket_options(sock: socket.socket) -> None:
    """Before bind: an IPv6 wildcard ("::") also takes IPv4 connections, whatever the host's default."""
    if sock.family == socket.AF_INET6:
        with contextlib.suppress(AttributeError, OSError):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)


def engine_healthy(url: str, timeout: float = HEALTH_TIMEOUT_SECONDS) -> bool:
    """True when the engine's /health answers 200."""
    # Imported at the first check, after the engine started: urllib.request costs serve about
    # 20 ms of CPU before the engine otherwise (its own imports beyond http.server's).
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def post_json(url: str, body: Any, timeout: float) -> tuple[int, str]:
    """POST `body` as JSON to the engine; (status, text) of its answer, an error status included.
    A connection that fails raises (OSError, URLError): the caller decides what that means."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def engines_healthy(urls: Sequence[str], timeout: float = HEALTH_TIMEOUT_SECONDS) -> list[bool]:
    """`engine_healthy` of each URL (a pod's ranks, each its own API server), asked at once."""
    if len(urls) <= 1:
        return [engine_healthy(url, timeout) for url in urls]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(urls), 16), thread_name_prefix="health") as pool:
        return list(pool.map(lambda url: engine_healthy(url, timeout), urls))


class _Collector:
    """A prometheus_client collector that builds the families from the status at scrape time."""

    def __init__(self, status: RuntimeStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Any]:
        yield from metrics.families(self.status.metric_values())


def exposition(status: RuntimeStatus) -> bytes:
    """The body of /metrics: `status`'s metric values in Prometheus' text format, built now."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(status))
    return generate_latest(registry)


class _HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer on IPv4 or IPv6, as `host` asks (the standard one is IPv4 only)."""

    daemon_threads = True

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family = address_family(host)
        super().__init__((host, port), handler)

    def server_bind(self) -> None:
        listening_socket_options(self.socket)
        super().server_bind()


class MetricsServer:
    """Serves the four endpoints for `status`; `engine_alive` and `health_url` describe the engine."""

    def __init__(
        self,
        status: RuntimeStatus,
        *,
        host: str,
        port: int,
        engine_alive: Callable[[], bool],
        health_url: str,
    ) -> None:
        self.status = status
        self.engine_alive = engine_alive
        self.health_url = health_url
        # Every URL /readyz asks: the engine's, or each rank's API server (serve --data-parallel-external).
        self.health_urls = [health_url]
        self.httpd = _HTTPServer(host, port, self._handler_class())
        self._thread: threading.Thread | None = None
        # Set once /status has answered in the failed state: someone (the operator) has read the failure.
        self.failure_read = threading.Event()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "npu-runtime"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        from prometheus_client import CONTENT_TYPE_LATEST

                        self._send(HTTPStatus.OK, exposition(server.status), CONTENT_TYPE_LATEST)
                    elif path == "/status":
                        document = server.status.document()
                        body = json.dumps(document, indent=2, sort_keys=True).encode()
                        self._send(HTTPStatus.OK, body + b"\n", "application/json")
                        if document.get("state") == "failed":
                            server.failure_read.set()
                    elif path == "/healthz":
                        self._plain(*server.healthz())
                    elif path == "/readyz":
                        self._plain(*server.readyz())
                    else:
                        self._plain(HTTPStatus.NOT_FOUND, "not found: try /metrics, /status, /healthz, /readyz")
                except Exception as exc:  # keep serving: one bad request must not kill the thread
                    self._plain(HTTPStatus.INTERNAL_SERVER_ERROR, f"error: {exc}")

            def _plain(self, status: HTTPStatus, text: str) -> None:
                self._send(status, (text + "\n").encode(), "text/plain; charset=utf-8")

            def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds would drown the engine's log

        return Handler

    def healthz(self) -> tuple[HTTPStatus, str]:
        """Alive: the runtime answers and the engine process (once started) is running."""
        state = self.status.state
        if state == "failed":
            return HTTPStatus.SERVICE_UNAVAILABLE, "failed"
        if state in ("starting", "stopping") or self.engine_alive():
            return HTTPStatus.OK, "ok"
        return HTTPStatus.SERVICE_UNAVAILABLE, "engine process is not running"

    def readyz(self) -> tuple[HTTPStatus, str]:
        """Ready: the engine's own /health answers 200 (every rank's, with one API server per rank)."""
        if self.status.state in ("failed", "stopping", "starting"):
            return HTTPStatus.SERVICE_UNAVAILABLE, self.status.state
        answers = engines_healthy(self.health_urls)
        waiting = [url for url, healthy in zip(self.health_urls, answers, strict=True) if not healthy]
        if not waiting and not self.status.adapters_settled():
            return HTTPStatus.SERVICE_UNAVAILABLE, "loading the listed LoRA adapters"
        if not waiting:
            return HTTPStatus.OK, "ready"
        if len(self.health_urls) > 1:
            return HTTPStatus.SERVICE_UNAVAILABLE, f"{len(waiting)} of {len(self.health_urls)} ranks not ready"
        return HTTPStatus.SERVICE_UNAVAILABLE, f"engine not ready ({self.status.state})"
