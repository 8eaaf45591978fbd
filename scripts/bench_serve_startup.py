#!/usr/bin/env python3
"""Startup time added by `npu-runtime serve` over starting the same vLLM engine directly.

Both start the same engine command line (the plan's engine flags, taken from `npu-runtime plan`):
directly as `python -m vllm.entrypoints.openai.api_server ...` until its /health answers 200, and
through `npu-runtime serve` until its /readyz answers 200 (which asks the engine's /health).
Runs alternate (direct, serve, direct, serve, ...) after one discarded warm-up, one engine at a
time, on the same machine in the same run; prints each time, the medians and the ratio.

    .venv/bin/python scripts/bench_serve_startup.py [--model DIR] [--rounds 2]

Without --model the tiny generated model is used (npu_sandbox.tiny_model).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from npu_sandbox.kubelet import free_port

SMALL = ["--max-num-seqs", "4", "--max-model-len", "512"]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def timed_start(argv: list[str], ready_url: str, env: dict[str, str], timeout: float = 600) -> float:
    start = time.monotonic()
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        while time.monotonic() - start < timeout:
            if process.poll() is not None:
                raise SystemExit(f"exited with {process.returncode}: {' '.join(argv)}")
            if answers(ready_url):
                return time.monotonic() - start
            time.sleep(0.1)
        raise SystemExit(f"not ready after {timeout} s: {' '.join(argv)}")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        time.sleep(2)  # let the engine's children go before the next start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from npu_sandbox.tiny_model import build_tiny_model

            model = str(build_tiny_model(Path(scratch) / "tiny"))
        plan = json.loads(
            subprocess.run(
                [sys.executable, "-m", "npu_runtime.cli", "plan", "--model", model, *SMALL, "--json"],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
        )
        engine_flags = plan["vllm_args"] + ["--max-model-len", "512"]

        def direct() -> float:
            port = free_port()
            argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
            argv += ["--host", "127.0.0.1", "--port", str(port), *engine_flags]
            return timed_start(argv, f"http://127.0.0.1:{port}/health", env)

        def serve() -> float:
            port, metrics = free_port(), free_port()
            argv = [sys.executable, "-m", "npu_runtime.cli", "serve", "--model", model, "--host", "127.0.0.1"]
            argv += ["--port", str(port), "--metrics-port", str(metrics), *SMALL]
            return timed_start(argv, f"http://127.0.0.1:{metrics}/readyz", env)

        print(f"warm-up (discarded): direct {direct():.1f} s", flush=True)
        times: dict[str, list[float]] = {"direct": [], "serve": []}
        for round_ in range(args.rounds):
            times["direct"].append(direct())
            times["serve"].append(serve())
            print(
                f"round {round_ + 1}: direct {times['direct'][-1]:.1f} s, serve {times['serve'][-1]:.1f} s", flush=True
            )
    d, s = statistics.median(times["direct"]), statistics.median(times["serve"])
    print(f"median to ready: direct {d:.1f} s, npu-runtime serve {s:.1f} s; added {s - d:+.1f} s, ratio {s / d:.3f}")


if __name__ == "__main__":
    main()
