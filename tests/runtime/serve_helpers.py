"""Run `npu-runtime serve` as a real subprocess and talk to it over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npu_runtime.routing.options import RouterOptions, route_argv
from npu_sandbox.node.kubelet import SHARED_CORES_ENV
from npu_sandbox.node.network import free_port
from npu_sandbox.progress import Progress, logs_progress
from prometheus_client.parser import text_string_to_metric_families


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def serve_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """Ours without the engine's own settings, a small KV cache, then `env` on top."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HCCL_", "ASCEND_"))}
    environment["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB: a small KV cache on the test machine
    environment.update(SHARED_CORES_ENV)  # engines started at once share the cores, as the kubelet's pods do
    environment.update(env or {})
    return environment


class ServeRun:
    """One `npu-runtime serve` process with its own ports, log and termination file."""

    def __init__(
        self,
        model: str | Path,
        args: list[str],
        directory: Path,
        env: dict[str, str] | None = None,
        api_port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.directory = directory
        self.host = host
        self.api_port = api_port or free_port()
        self.metrics_port = free_port()
        self.termination = directory / "termination-log"
        self.log_path = directory / "serve.log"
        self.argv = [
            sys.executable,
            "-m",
            "npu_runtime.cli",
            "serve",
            "--model",
            str(model),
            "--host",
            host,
            "--port",
            str(self.api_port),
            "--metrics-port",
            str(self.metrics_port),
            "--termination-log",
            str(self.termination),
            *args,
        ]
        environment = serve_environment(env)
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed in cleanup)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )

    # ----- HTTP -----

    def get(self, path: str, *, port: int | None = None, timeout: float = 5) -> tuple[int, str]:
        url = f"http://{self.host}:{port or self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        assert code == 200, body
        document: dict[str, Any] = json.loads(body)
        return document

    def metrics(self) -> dict[str, list[tuple[str, dict[str, str], float]]]:
        code, body = self.get("/metrics")
        assert code == 200, body
        return {
            family.name: [(s.name, s.labels, s.value) for s in family.samples]
            for family in text_string_to_metric_families(body)
        }

    def complete(self, prompt: str, max_tokens: int = 8, **fields: Any) -> dict[str, Any]:
        """A completion; `fields` go into the request as they are (ignore_eos=True, ...)."""
        body = {"model": self.model_name(), "prompt": prompt, "max_tokens": max_tokens, **fields}
        request = urllib.request.Request(
            f"http://{self.host}:{self.api_port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    def model_name(self) -> str:
        code, body = self.get("/v1/models", port=self.api_port)
        assert code == 200, body
        return str(json.loads(body)["data"][0]["id"])

    # ----- lifecycle -----

    def log_tail(self, lines: int = 60) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, progress: Progress | None = None, interval: float = 0.5) -> float:
        """Seconds until /readyz answered 200. Fails with the log tail if serve exits, or once `progress`
        says the start stopped advancing (by default: its log, serve's and the engine's, stopped growing
        for STALL_SECONDS, or CEILING_SECONDS passed)."""
        progress = progress or logs_progress(lambda: [self.log_path])
        while (why := progress.check()) is None:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if self.get("/readyz", timeout=3)[0] == 200:
                    return time.monotonic() - self.started
            time.sleep(interval)
        raise AssertionError(f"serve not ready: {why}:\n{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"serve still running after {timeout} s:\n{self.log_tail()}") from None

    def terminate(self, timeout: float) -> tuple[int, float]:
        """SIGTERM serve (as the kubelet does); (exit status, seconds it took)."""
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.wait_exit(timeout)
        return code, time.monotonic() - start

    def cleanup(self, engine_pids: list[int] | None = None) -> None:
        if self.process.poll() is None:
            # serve starts the engine in a session of its own (as in a pod): its whole process
            # group (API server or headless launcher, DP coordinator, engine cores, workers) goes
            # first, or a SIGKILL of serve alone would leave it running.
            with contextlib.suppress(OSError, ValueError, AssertionError, KeyError, TypeError):
                document = self.status()
                # --data-parallel-external: each rank's API server is a process group of its own.
                groups = {
                    int(document["engine"]["pid"]),
                    *(int(r["pid"]) for r in document.get("ranks", []) if r.get("pid")),
                }
                for engine in groups:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(engine, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        for pid in engine_pids or []:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.log.close()

    def engine_pids(self) -> list[int]:
        """Every engine process the observer reported, and the engine's main process."""
        document = self.status()
        pids = {int(p["pid"]) for p in document["observer"]["processes"]}
        if document["engine"]["pid"]:
            pids.add(int(document["engine"]["pid"]))
        return sorted(pids)


def rendered_serve_args(args: Sequence[str], storage: Path) -> list[str]:
    """A P/D role's rendered serve args (the kubelet's $(VAR)s expanded) from --shutdown-timeout on,
    without the user's engine extras (model and ports are ServeRun's), its connector's KV folder
    `storage` (the file-based connector of a CPU)."""
    rest = list(args[list(args).index("--shutdown-timeout") :])
    rest = rest[: rest.index("--")] if "--" in rest else rest
    at = rest.index("--kv-transfer-config") + 1
    config = json.loads(rest[at])
    config["kv_connector_extra_config"]["shared_storage_path"] = str(storage)
    rest[at] = json.dumps(config)
    return rest


def route_command(
    options: RouterOptions, prefill: Sequence[str], decode: Sequence[str], port: int, metrics_port: int
) -> list[str]:
    """`npu-runtime route` with the operator's rendered `options`, the role Services' names replaced by
    these engines' URLs, on 127.0.0.1 at these ports."""
    engines = [arg for url in prefill for arg in ("--prefill", url)]
    engines += [arg for url in decode for arg in ("--decode", url)]
    rest = [
        arg for arg in route_argv(options) if not arg.startswith("http://") and arg not in ("--prefill", "--decode")
    ]
    rest[rest.index("--port") + 1], rest[rest.index("--metrics-port") + 1] = str(port), str(metrics_port)
    return [sys.executable, "-m", "npu_runtime.cli", "route", *engines, *rest, "--host", "127.0.0.1"]


def post_json(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def wait_router(metrics_port: int, router: subprocess.Popen[bytes], log: Path) -> None:
    """Until the router's /readyz (on its metrics port) answers 200; fails with its log if it exits."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert router.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=3) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"router not ready:\n{log.read_text()}")
