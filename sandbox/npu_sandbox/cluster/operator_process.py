"""The real operator run as its own process against the sandbox's API: its environment and its stop.

What the tests and `scripts/bench_operator.py` need to run `python -m npu_operator.cli run` beside
a `LocalCluster`: this checkout's packages (or another checkout's operator), standalone, no ports,
warnings only, the example's hostPath model source allowed; and a stop that gives kopf its
graceful shutdown (SIGINT) before it is killed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[3]
SANDBOX_MODELS: Final = "/tmp/npu-sandbox/models"  # examples/sandbox-cpu.yaml's spec.model.source.hostPath
STOP_SECONDS: Final = 30.0


def operator_env(kubeconfig: Path, *, operator_path: Path | None = None, **extra: str) -> dict[str, str]:
    """The operator process's environment: the packages of this checkout (the operator from
    `operator_path` when given: another checkout's, to measure it), `extra` on top."""
    operator = operator_path if operator_path is not None else ROOT / "operator"
    return {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONPATH": os.pathsep.join([str(operator), str(ROOT / "runtime"), str(ROOT / "sandbox")]),
        "NPU_OPERATOR_STANDALONE": "true",
        "NPU_OPERATOR_METRICS_PORT": "0",
        "NPU_OPERATOR_HEALTH_PORT": "0",
        "NPU_OPERATOR_LOG_LEVEL": "WARNING",
        "NPU_OPERATOR_ALLOWED_HOST_PATHS": SANDBOX_MODELS,
        **extra,
    }


async def stop(process: asyncio.subprocess.Process) -> None:
    """SIGINT (kopf finishes its handlers and exits), killed after STOP_SECONDS."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(process.wait(), STOP_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
