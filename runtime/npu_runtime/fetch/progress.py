"""A fetch's progress: measured while the library works, written beside the lock, served on `/status`."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from npu_runtime.fetch.hub import Hub
from npu_runtime.fetch.listing import Listing
from npu_runtime.fetch.verify import Verification


@dataclasses.dataclass
class Progress:
    """What `/status` and the progress file say: the shape of the operator's status.model."""

    source: str
    repository: str
    revision: str | None = None
    phase: str = "Resolving"  # Resolving, Waiting, Downloading, Verifying, Ready, Failed
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    reason: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "source": self.source,
            "repository": self.repository,
            "revision": self.revision,
            "phase": self.phase,
            "bytesDone": self.bytes_done,
            "bytesTotal": self.bytes_total,
            "filesDone": self.files_done,
            "filesTotal": self.files_total,
            "reason": self.reason,
            "message": self.message,
        }
        return {key: value for key, value in out.items() if value is not None}


@contextlib.contextmanager
def watch(
    progress: Progress, hub: Hub, folder: Path, listing: Listing, verification: Verification, progress_file: Path
) -> Iterator[None]:
    """Measures the verified bytes (`Hub.measure`) and writes the progress file, each second while the library works."""
    stop = threading.Event()

    def tick() -> None:
        progress.bytes_done, progress.files_done = hub.measure(folder, listing, verification)
        write_json(progress_file, progress.to_dict())

    def loop() -> None:
        while not stop.wait(1.0):
            tick()

    tick()
    thread = threading.Thread(target=loop, name="fetch-progress", daemon=True)
    thread.start()
    finished = False
    try:
        yield
        finished = True
    finally:
        stop.set()
        thread.join()
        if not finished:
            tick()  # what a download that failed had verified (a fetch that succeeds writes its end itself)


def adopt(progress: Progress, progress_file: Path) -> None:
    """Takes the bytes and files done from the progress file another replica writes."""
    with contextlib.suppress(OSError, ValueError):
        theirs = json.loads(progress_file.read_text())
        progress.bytes_done = int(theirs.get("bytesDone", progress.bytes_done))
        progress.files_done = int(theirs.get("filesDone", progress.files_done))


def write_json(path: Path, payload: Any) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True))
    os.replace(tmp, path)


class StatusServer:
    """`/status` -> {"model": progress, "adapters": [progress, ...]}: what the operator reads while the init
    container runs (no "model" when only adapters are fetched, no "adapters" without --adapters)."""

    def __init__(
        self, progress: Progress | None, port: int, host: str = "0.0.0.0", adapters: Sequence[Progress] = ()
    ) -> None:
        shown, listed = progress, list(adapters)

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/status", "/healthz"):
                    self.send_error(404)
                    return
                document: dict[str, Any] = {"state": "fetching"}
                if shown is not None:
                    document["model"] = shown.to_dict()
                if listed:
                    document["adapters"] = [item.to_dict() for item in listed]
                body = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fetch-status", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
