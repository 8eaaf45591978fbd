"""`python -m tests.sandbox.node.stub_pod --port N -- ARGS`: a stand-in process for a pod's container.

It answers /readyz and /healthz with 200 and /status with the args it was given, so tests of the
sandbox's kubelet and controllers can run many pods in a second, without an engine, and check
what the kubelet handed the container (ports, node rank, the leader's address).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("args", nargs="*")
    options = parser.parse_args(argv)
    document = json.dumps({"state": "serving", "pid": os.getpid(), "args": options.args}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = document if self.path == "/status" else b"ok"
            self.send_response(200 if self.path in ("/status", "/readyz", "/healthz") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    with http.server.ThreadingHTTPServer(("127.0.0.1", options.port), Handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
