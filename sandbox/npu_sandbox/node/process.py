"""A pod's processes on this machine: started in the pod's namespaces with its log as their output,
dying with the sandbox, stopped as a kubelet stops them (SIGTERM, the grace period, SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import sys
from pathlib import Path

from npu_sandbox.node.isolation import PodNamespace

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the sandbox dies, however it dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


async def exec_in_pod(
    args: list[str], env: dict[str, str], names: PodNamespace, log_path: Path
) -> asyncio.subprocess.Process:
    """`args` (an executable found next to this Python or on PATH) as a session of its own, in the
    pod's namespaces (`names`), stdout and stderr appended to `log_path`."""
    executable = shutil.which(args[0], path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if executable is None:
        raise FileNotFoundError(f"{args[0]} is not installed next to {sys.executable}")
    names.prepare()

    def in_the_child() -> None:  # between fork and exec: the pod's namespaces, then die with the sandbox
        names.enter()
        die_with_parent()

    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            executable,
            *args[1:],
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=in_the_child,
        )


async def terminate(process: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM, `grace` seconds, then SIGKILL for the process's whole group; nothing if it has exited."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
