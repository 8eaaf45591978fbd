#!/usr/bin/env python3
"""Startup time added by `npu-runtime serve` over starting the same vLLM engine directly.

Both start the same engine command line (the plan's engine flags, taken from `npu-runtime plan`):
directly as `python -m vllm.entrypoints.openai.api_server ...` (`launch.engine_argv`, as serve
builds it) until its /health answers 200, and through `npu-runtime serve` (the tests' `ServeRun`)
until its /readyz answers 200 (which asks the engine's /health). Both are polled every 0.1 s.
Runs alternate (direct, serve, direct, serve, ...) after one discarded warm-up, one engine at a
time, on the same machine in the same run; prints each time, the medians and the ratio, and serve's
own time before the engine starts (from serve's start to its "starting the engine" log line: the
checks, the device probe, the model inspection and the plan).

    .venv/bin/python scripts/bench_serve_startup.py [--model DIR] [--rounds 2]
    .venv/bin/python scripts/bench_serve_startup.py --before-engine-only --rounds 5   # no engine waits

--before-engine-only starts serve, takes that time and stops it (and the engine it began): a quick
figure for serve's own overhead that needs no engine start. Next to it, in the same rounds, an
empty interpreter's start (`python -c pass`, until it exits): the part of that time no code of
ours can remove, and a gauge of how loaded the machine is. PYTHONPATH=<checkout>/runtime measures
another checkout's runtime (serve runs in a child interpreter with the caller's environment).
The measured runtime's bytecode is compiled first, as `pip install` does in the images (a
checkout run with PYTHONDONTWRITEBYTECODE=1 would otherwise compile its modules at every start).

Without --model the tiny generated model is used (npu_sandbox.fixtures.tiny_model).
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
from npu_sandbox.node.network import free_port
from npu_sandbox.progress import logs_progress

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


ENGINE_STARTS = "npu-runtime: starting the engine:"  # serve's log line just before it starts the engine


def until_engine_starts(run: ServeRun) -> float:
    """Seconds from serve's start to its log line saying the engine starts (polled every 10 ms)."""
    while time.monotonic() - run.started < TIMEOUT_SECONDS:
        if ENGINE_STARTS in run.log_path.read_text(errors="replace"):
            return time.monotonic() - run.started
        if run.process.poll() is not None:
            raise SystemExit(f"serve exited with {run.process.returncode}:\n{run.log_tail()}")
        time.sleep(0.01)
    raise SystemExit(f"serve did not start the engine within {TIMEOUT_SECONDS:g} s:\n{run.log_tail()}")


def serve(model: str, env: dict[str, str], scratch: Path, *, engine: bool = True) -> tuple[float, float]:
    """Seconds until `npu-runtime serve` starts the engine, and until it answers /readyz (0 without `engine`)."""
    run = ServeRun(model, SMALL, Path(tempfile.mkdtemp(prefix="serve-", dir=scratch)), env=env)
    try:
        before = until_engine_starts(run)
        if not engine:
            return before, 0.0
        progress = logs_progress(lambda: [run.log_path], ceiling=TIMEOUT_SECONDS)
        return before, run.wait_ready(progress, interval=POLL_SECONDS)
    finally:
        if run.process.poll() is None:
            run.terminate(60)
        run.cleanup()
        time.sleep(SETTLE_SECONDS if engine else 0.5)


def empty_interpreter(env: dict[str, str]) -> float:
    """Seconds for `python -c pass` to start and exit."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True, env=env)
    return time.monotonic() - start


def compile_runtime(env: dict[str, str]) -> None:
    """The bytecode of the npu_runtime that serve will import (the one on the caller's PYTHONPATH)."""
    code = "import compileall, os, npu_runtime; compileall.compile_dir(os.path.dirname(npu_runtime.__file__), quiet=1)"
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before-engine-only", action="store_true", help="only serve's time before the engine starts")
    args = parser.parse_args()

    env = serve_environment(dict(os.environ))  # the caller's engine settings too; a small KV cache unless set
    compile_runtime(env)
    with tempfile.TemporaryDirectory() as directory:
        scratch = Path(directory)
        model = args.model
        if model is None:
            from npu_sandbox.fixtures.tiny_model import build_tiny_model

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

        times: dict[str, list[float]] = {"direct": [], "serve": [], "before engine": [], "empty": []}
        if args.before_engine_only:
            for round_ in range(args.rounds):
                times["empty"].append(empty_interpreter(env))
                times["before engine"].append(serve(model, env, scratch, engine=False)[0])
                print(
                    f"round {round_ + 1}: serve started the engine after {times['before engine'][-1]:.2f} s "
                    f"(an empty interpreter: {times['empty'][-1]:.2f} s)"
                )
            starts, empty = times["before engine"], times["empty"]
            print(f"serve's own time before the engine starts: median {statistics.median(starts):.2f} s "
                  f"(min {min(starts):.2f}, max {max(starts):.2f}, {len(starts)} runs); "
                  f"an empty interpreter's start: median {statistics.median(empty):.2f} s, "
                  f"{statistics.median(starts) / statistics.median(empty):.1f}x; "
                  f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
            return
        print(f"warm-up (discarded): direct {direct(model, engine_flags, env, scratch):.1f} s", flush=True)
        for round_ in range(args.rounds):
            times["direct"].append(direct(model, engine_flags, env, scratch))
            before, ready = serve(model, env, scratch)
            times["serve"].append(ready)
            times["before engine"].append(before)
            print(
                f"round {round_ + 1}: direct {times['direct'][-1]:.1f} s, serve {ready:.1f} s "
                f"(the engine started after {before:.2f} s)",
                flush=True,
            )
    d, s = statistics.median(times["direct"]), statistics.median(times["serve"])
    print(f"median to ready: direct {d:.1f} s, npu-runtime serve {s:.1f} s; added {s - d:+.1f} s, ratio {s / d:.3f}")
    print(f"serve's own time before the engine starts: median {statistics.median(times['before engine']):.2f} s")


if __name__ == "__main__":
    main()
