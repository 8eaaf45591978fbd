"""`python -m tests.sandbox.node.stub_pod --host H --port N -- ARGS`: a stand-in process for a pod's container.

It answers /readyz and /healthz with 200, /status with the args it was given and its hostname,
and /resolve?name=NAME with what its own resolver answers for NAME (in the pod's mount namespace:
the pod's /etc/hosts), so tests of the sandbox's kubelet and controllers can run many pods in a
second, without an engine, and check what the kubelet handed the container (its address, node
rank, the leader's address) and which names resolve in it.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import sys
import urllib.parse
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("args", nargs="*")
    options = parser.parse_args(argv)
    status = {"state": "serving", "pid": os.getpid(), "args": options.args, "hostname": socket.gethostname()}
    document = json.dumps(status).encode()

    def resolve(name: str) -> bytes:
        try:
            found = sorted({info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET)})
        except socket.gaierror as exc:
            return json.dumps({"error": exc.strerror}).encode()
        return json.dumps({"addresses": found}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            if url.path == "/resolve":
                body = resolve(urllib.parse.parse_qs(url.query)["name"][0])
            else:
                body = document if self.path == "/status" else b"ok"
            self.send_response(200 if url.path in ("/status", "/readyz", "/healthz", "/resolve") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    with http.server.ThreadingHTTPServer((options.host, options.port), Handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
