#!/usr/bin/env python3
"""Startup time added by `npu-runtime serve` over starting the same vLLM engine directly.

Both start the same engine command line (the plan's engine flags, taken from `npu-runtime plan`):
directly as `python -m vllm.entrypoints.openai.api_server ...` (`launch.engine_argv`, as serve
builds it) until its /health answers 200, and through `npu-runtime serve` (the tests' `ServeRun`)
until its /readyz answers 200 (which asks the engine's /health). Both are polled every 0.1 s.
Runs alternate (direct, serve, direct, serve, ...) after one discarded warm-up, one engine at a
time, on the same machine in the same run; prints each time, the medians and the ratio.

    .venv/bin/python scripts/bench_serve_startup.py [--model DIR] [--rounds 2]

Without --model the tiny generated model is used (npu_sandbox.tiny_model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu_runtime.contract import parse_serve_args
from npu_runtime.serving import launch
from npu_runtime.serving.server import engine_healthy
from npu_sandbox.kubelet import free_port

from tests.runtime.serve_helpers import ServeRun, serve_environment

SMALL = ["--max-num-seqs", "4", "--max-model-len", "512"]
POLL_SECONDS = 0.1
TIMEOUT_SECONDS = 600.0
SETTLE_SECONDS = 2.0  # let the engine's children go before the next start


def direct(model: str, engine_flags: list[str], env: dict[str, str], scratch: Path) -> float:
    """Seconds until the engine, started without serve, answers /health."""
    port = free_port()
    options = parse_serve_args(["--model", model, "--host", "127.0.0.1", "--port", str(port)])
    url = f"http://127.0.0.1:{port}/health"
    with open(scratch / "direct.log", "a") as log:
        engine = launch.EngineProcess(launch.engine_argv(options, engine_flags), env, output=log)
        start = time.monotonic()
        engine.start()
        try:
            while time.monotonic() - start < TIMEOUT_SECONDS:
                code = engine.poll()
                if code is not None:
                    raise SystemExit(f"exited with {code}: {' '.join(engine.argv)} (log: {log.name})")
                if engine_healthy(url):
                    return time.monotonic() - start
                time.sleep(POLL_SECONDS)
            raise SystemExit(f"not ready after {TIMEOUT_SECONDS:g} s: {' '.join(engine.argv)}")
        finally:
            engine.stop(60)
            time.sleep(SETTLE_SECONDS)


def serve(model: str, env: dict[str, str], scratch: Path) -> float:
    """Seconds until `npu-runtime serve` answers /readyz."""
    run = ServeRun(model, SMALL, Path(tempfile.mkdtemp(prefix="serve-", dir=scratch)), env=env)
    try:
        return run.wait_ready(TIMEOUT_SECONDS, interval=POLL_SECONDS)
    finally:
        if run.process.poll() is None:
            run.terminate(60)
        run.cleanup()
        time.sleep(SETTLE_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    env = serve_environment(dict(os.environ))  # the caller's engine settings too; a small KV cache unless set
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        model = args.model
        if model is None:
            from npu_sandbox.tiny_model import build_tiny_model

            model = str(build_tiny_model(scratch / "tiny"))
        plan = json.loads(
            subprocess.run(
                [sys.executable, "-m", "npu_runtime.cli", "plan", "--model", model, *SMALL, "--json"],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
        )
        engine_flags: list[str] = plan["vllm_args"]  # SMALL's limits are among them

        print(f"warm-up (discarded): direct {direct(model, engine_flags, env, scratch):.1f} s", flush=True)
        times: dict[str, list[float]] = {"direct": [], "serve": []}
        for round_ in range(args.rounds):
            times["direct"].append(direct(model, engine_flags, env, scratch))
            times["serve"].append(serve(model, env, scratch))
            print(
                f"round {round_ + 1}: direct {times['direct'][-1]:.1f} s, serve {times['serve'][-1]:.1f} s", flush=True
            )
    d, s = statistics.median(times["direct"]), statistics.median(times["serve"])
    print(f"median to ready: direct {d:.1f} s, npu-runtime serve {s:.1f} s; added {s - d:+.1f} s, ratio {s / d:.3f}")


if __name__ == "__main__":
    main()
