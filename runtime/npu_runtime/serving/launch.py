"""Start vLLM's OpenAI server as a child process, relay its output, stop it cleanly.

The engine runs as `python -m vllm.entrypoints.openai.api_server` (valid on every vLLM build,
the CPU build and the vllm-ascend images included) in its own session. A stop sends SIGTERM to
the API server alone (vLLM shuts its engine core and workers down itself), waits for the grace
period, then SIGKILLs the process group. After any exit, whatever is left of the engine is
killed: its process group, and every process it left behind. For the latter the runtime makes
itself a child subreaper (Linux prctl), so orphaned engine processes are re-parented to it
(as they would be to PID 1 in a container) and can be found as its children and reaped.

Its stdout and stderr are merged and relayed line by line to our stdout (the container log),
and every line goes to a callback (the failure scanner).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, TextIO

from npu_runtime import kv_events, reports
from npu_runtime.contract import ASCEND_RECOMMENDED_ENV, ServeOptions

ENGINE_MODULE: Final = "vllm.entrypoints.openai.api_server"
HEADLESS_MODULE: Final = "npu_runtime.serving.headless"
PROMETHEUS_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
PLUGINS_ENV: Final = "VLLM_PLUGINS"


_subreaper = False


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux PR_SET_CHILD_SUBREAPER); False where unsupported."""
    global _subreaper
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = _subreaper or int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:
        return False
    return _subreaper


def child_pids(parent: int) -> list[int]:
    """Live children of `parent`, from /proc (empty where there is no /proc)."""
    children: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit() and int(fields[1]) == parent and fields[0] != "Z":
            children.append(int(entry))
    return children


def kill_adopted_children(timeout: float = 5.0) -> list[int]:
    """SIGKILL and reap the engine processes this subreaper adopted, until none is left.

    A no-op unless `become_subreaper()` succeeded in this process: then our only children are
    the engine's (the runtime starts nothing else), and killing an adopted engine core orphans
    its workers to us in turn, hence the loop.
    """
    if not _subreaper:
        return []
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = child_pids(os.getpid())
        if not children:
            break
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        pending = set(children)
        while pending and time.monotonic() < deadline:
            for pid in list(pending):
                try:
                    reaped, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    reaped = pid
                if reaped:
                    pending.discard(pid)
            if pending:
                time.sleep(0.02)
    return killed


def engine_argv(
    options: ServeOptions, vllm_args: Sequence[str], *, python: str | None = None, vllm_version: str | None = None
) -> list[str]:
    """The engine's command line: model, address, the plan's engine flags, then the user's extras.

    A multi-node replica's worker (--headless among the flags) runs `npu_runtime.serving.headless`, vLLM's
    headless launcher, instead of the API server. With --kv-events the engine publishes its KV events
    (`kv_events.engine_args`; the render endpoints' switch for the installed `vllm_version` only on an
    API server).
    """
    headless = "--headless" in vllm_args
    module = HEADLESS_MODULE if headless else ENGINE_MODULE
    argv = [python or sys.executable, "-m", module, "--model", options.model]
    if options.served_model_name:
        argv += ["--served-model-name", options.served_model_name]
    argv += ["--host", options.host, "--port", str(options.port)]
    argv += list(vllm_args)
    if options.additional_config is not None:
        argv += ["--additional-config", options.additional_config]  # vllm-ascend's engine argument
    if options.kv_transfer_config is not None:
        argv += ["--kv-transfer-config", options.kv_transfer_config]  # already mapped to the device
    if options.kv_events_topic is not None:
        argv += kv_events.engine_args(options.kv_events_topic, None if headless else vllm_version, options.host)
    argv += list(options.extra_engine_args)
    return argv


def engine_env(base: Mapping[str, str], *, observer_dir: str, prometheus_dir: str | None = None) -> dict[str, str]:
    """The engine's environment: ours plus the observer, a fresh multiprocess dir, Ascend defaults.

    - VLLM_PLUGINS, when set, is a whitelist: ours is added and nothing is dropped (the Ascend
      platform plugin and other general plugins still load). Unset means all plugins load.
    - PROMETHEUS_MULTIPROC_DIR is only replaced, never introduced: if the pod sets it, vLLM's own
      metrics use it and want it empty per run, so the engine gets a fresh subdirectory.
    - The recommended Ascend variables are set where the user has not set them.
    """
    env = dict(base)
    env[reports.ENV_DIR] = observer_dir
    plugins = env.get(PLUGINS_ENV)
    if plugins is not None and plugins.strip():
        names = [name.strip() for name in plugins.split(",") if name.strip()]
        if reports.PLUGIN_NAME not in names:
            names.append(reports.PLUGIN_NAME)
        env[PLUGINS_ENV] = ",".join(names)
    if prometheus_dir is not None:
        env[PROMETHEUS_ENV] = prometheus_dir
    for name, value in ASCEND_RECOMMENDED_ENV.items():
        env.setdefault(name, value)
    return image_shell_env(env)


# What vllm-ascend's images write into ~/.bashrc (Dockerfile, Dockerfile.a3, Dockerfile.a5,
# Dockerfile.310p, v0.23.0: `RUN echo "export LD_PRELOAD=/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2:$LD_PRELOAD"`
# and `... LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/lib`): only an interactive bash reads it, and
# a pod's container execs `npu-runtime` directly, so the runtime adds both itself, in a CANN image only.
CANN_HOME: Final = "/usr/local/Ascend"
JEMALLOC: Final = "/usr/lib/{machine}-linux-gnu/libjemalloc.so.2"
IMAGE_LIBRARY_DIR: Final = "/usr/local/lib"


def image_shell_env(
    env: Mapping[str, str], *, exists: Callable[[str], bool] = os.path.exists, machine: str | None = None
) -> dict[str, str]:
    """`env` with the image's shell setup: jemalloc first in LD_PRELOAD and /usr/local/lib last in
    LD_LIBRARY_PATH, where the image has them and `env` does not already; unchanged outside a CANN image."""
    result = dict(env)
    if not exists(CANN_HOME):
        return result
    jemalloc = JEMALLOC.format(machine=machine or platform.machine())
    preload = [item for item in result.get("LD_PRELOAD", "").split(":") if item]
    if exists(jemalloc) and not any(item.endswith("/libjemalloc.so.2") for item in preload):
        result["LD_PRELOAD"] = ":".join([jemalloc, *preload])
    libraries = [item for item in result.get("LD_LIBRARY_PATH", "").split(":") if item]
    if exists(IMAGE_LIBRARY_DIR) and IMAGE_LIBRARY_DIR not in libraries:
        result["LD_LIBRARY_PATH"] = ":".join([*libraries, IMAGE_LIBRARY_DIR])
    return result


class RunDirs:
    """Fresh per-run directories (observer reports, prometheus multiprocess), removed on close."""

    def __init__(self, base_env: Mapping[str, str]) -> None:
        self.observer = tempfile.mkdtemp(prefix="npu-runtime-observer-")
        self.prometheus: str | None = None
        parent = base_env.get(PROMETHEUS_ENV)
        if parent:
            os.makedirs(parent, exist_ok=True)
            self.prometheus = tempfile.mkdtemp(prefix="run-", dir=parent)

    def close(self) -> None:
        for path in (self.observer, self.prometheus):
            if path:
                shutil.rmtree(path, ignore_errors=True)


class EngineProcess:
    """One engine process tree."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        on_line: Callable[[str], None] | None = None,
        output: TextIO | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.on_line = on_line
        self.output = output if output is not None else sys.stdout
        self.process: subprocess.Popen[str] | None = None
        self._relay: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self._relay = threading.Thread(target=self._relay_output, name="engine-output", daemon=True)
        self._relay.start()

    def _relay_output(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(OSError, ValueError):
                self.output.write(line)
                self.output.flush()
            if self.on_line is not None:
                with contextlib.suppress(Exception):
                    self.on_line(line)

    def poll(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the engine's process group."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def stop(self, grace: float) -> tuple[int | None, bool]:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL; (exit code, whether it had to be killed)."""
        if self.process is None:
            return None, False
        self.signal(signal.SIGTERM)
        code = self.wait(grace)
        killed = code is None
        if killed:
            self.kill_group()
            code = self.wait(10)
        self.finish()
        return code, killed

    def finish(self, relay_timeout: float = 5.0) -> list[int]:
        """After the main process exited: kill leftovers, let the relay drain the last lines.

        Returns the pids of adopted leftovers that had to be killed.
        """
        self.kill_group()
        leftovers = kill_adopted_children()
        if self._relay is not None:
            self._relay.join(relay_timeout)
        return leftovers
