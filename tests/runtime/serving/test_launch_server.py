"""The engine's command line and environment, process supervision with stub engines, and the HTTP
endpoints (no vLLM needed: the engine-backed versions are in test_serve_engine.py)."""

from __future__ import annotations

import errno
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from npu_runtime import reports
from npu_runtime.cli import EXIT_INVALID
from npu_runtime.contract import ASCEND_RECOMMENDED_ENV, ServeOptions
from npu_runtime.serving import failures, launch
from npu_runtime.serving.serve import EXIT_FAILED, ServeError, Supervisor, check_port_free, local_address
from npu_runtime.serving.server import MetricsServer
from npu_runtime.serving.status import PlanView, RuntimeStatus

# ----- command line and environment -----


def test_engine_argv_puts_the_users_extra_args_last() -> None:
    options = ServeOptions(
        model="/models/qwen",
        served_model_name="qwen",
        host="0.0.0.0",
        port=8000,
        extra_engine_args=("--max-num-seqs", "8", "--trust-remote-code"),
    )
    argv = launch.engine_argv(options, ["--compilation-config", "{}", "--max-num-seqs", "16"], python="py")
    assert argv == [
        "py",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/qwen",
        "--served-model-name",
        "qwen",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--compilation-config",
        "{}",
        "--max-num-seqs",
        "16",
        "--max-num-seqs",  # argparse: the last one wins, so the user can override the plan
        "8",
        "--trust-remote-code",
    ]


def test_engine_env_enables_the_observer_and_keeps_other_plugins() -> None:
    env = launch.engine_env({"VLLM_PLUGINS": "ascend, ascend_kv_connector"}, observer_dir="/tmp/o")
    assert env["VLLM_PLUGINS"] == "ascend,ascend_kv_connector,npu_graph_observer"
    assert env[reports.ENV_DIR] == "/tmp/o"
    assert launch.engine_env({"VLLM_PLUGINS": "npu_graph_observer"}, observer_dir="/o")["VLLM_PLUGINS"] == (
        "npu_graph_observer"
    )
    assert "VLLM_PLUGINS" not in launch.engine_env({}, observer_dir="/o")  # unset: every plugin loads


def test_engine_env_sets_the_ascend_defaults_unless_the_user_did() -> None:
    env = launch.engine_env({"TASK_QUEUE_ENABLE": "2"}, observer_dir="/o")
    assert env["TASK_QUEUE_ENABLE"] == "2"
    for name, value in ASCEND_RECOMMENDED_ENV.items():
        if name != "TASK_QUEUE_ENABLE":
            assert env[name] == value


def test_prometheus_multiproc_dir_is_fresh_per_run_and_never_introduced(tmp_path: Path) -> None:
    assert "PROMETHEUS_MULTIPROC_DIR" not in launch.engine_env({}, observer_dir="/o")
    parent = tmp_path / "prom"
    parent.mkdir()
    (parent / "counter_123.db").write_bytes(b"stale")
    dirs = launch.RunDirs({"PROMETHEUS_MULTIPROC_DIR": str(parent)})
    assert dirs.prometheus is not None
    fresh = Path(dirs.prometheus)
    assert fresh.parent == parent
    assert list(fresh.iterdir()) == []
    env = launch.engine_env({"PROMETHEUS_MULTIPROC_DIR": str(parent)}, observer_dir="/o", prometheus_dir=str(fresh))
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(fresh)
    dirs.close()
    assert not fresh.exists()
    assert not Path(dirs.observer).exists()
    assert (parent / "counter_123.db").exists()  # the user's directory itself is left alone


# ----- supervision with stub engines -----

STUBBORN_ENGINE = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# A worker in a session of its own: not in the engine's process group.
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print("worker", worker.pid, flush=True)
time.sleep(600)
"""


def test_output_is_relayed_and_scanned() -> None:
    lines: list[str] = []
    out = io.StringIO()
    engine = launch.EngineProcess(
        [sys.executable, "-c", "import sys; print('hello'); print('boom', file=sys.stderr); sys.exit(3)"],
        dict(os.environ),
        on_line=lines.append,
        output=out,
    )
    engine.start()
    assert engine.wait(30) == 3
    engine.finish()
    assert sorted(lines) == ["boom\n", "hello\n"]
    assert "hello" in out.getvalue()


def test_a_graceful_engine_stops_on_sigterm() -> None:
    engine = launch.EngineProcess(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        dict(os.environ),
        output=io.StringIO(),
    )
    engine.start()
    time.sleep(0.5)
    code, killed = engine.stop(10)
    assert (code, killed) == (-15, False)


def test_a_stubborn_engine_is_killed_with_everything_it_left_behind(tmp_path: Path) -> None:
    # In a process of its own: it becomes a child subreaper, which must not happen to pytest.
    script = tmp_path / "supervise.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import io, os, sys, time
            from npu_runtime.serving import launch
            assert launch.become_subreaper()
            lines = []
            engine = launch.EngineProcess([sys.executable, "-c", {STUBBORN_ENGINE!r}], dict(os.environ),
                                          on_line=lines.append, output=io.StringIO())
            engine.start()
            while not lines:
                time.sleep(0.05)
            worker = int(lines[0].split()[1])
            start = time.monotonic()
            code, killed = engine.stop(1.0)
            took = time.monotonic() - start
            try:
                os.kill(worker, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            print(code, killed, round(took), alive)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["-9", "True", "1", "False"]


# ----- the HTTP endpoints -----


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


class Health(http.server.BaseHTTPRequestHandler):
    ok = True

    def do_GET(self) -> None:
        self.send_response(200 if Health.ok else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def engine_health() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


@pytest.fixture
def server(tmp_path: Path, engine_health: str) -> Iterator[tuple[MetricsServer, RuntimeStatus, list[bool]]]:
    status = RuntimeStatus(str(tmp_path), "FULL_DECODE_ONLY")
    status.set_plan(PlanView("FULL_DECODE_ONLY", "NONE", {"effective_mode": "NONE"}))
    alive = [True]
    metrics_server = MetricsServer(
        status, host="127.0.0.1", port=0, engine_alive=lambda: alive[0], health_url=engine_health
    )
    metrics_server.start()
    yield metrics_server, status, alive
    metrics_server.close()


def test_endpoints(server: tuple[MetricsServer, RuntimeStatus, list[bool]]) -> None:
    metrics_server, status, alive = server
    base = f"http://127.0.0.1:{metrics_server.port}"
    assert get(base + "/healthz")[0] == 200  # starting: the runtime answers
    assert get(base + "/readyz")[0] == 503  # not before the engine runs
    status.set_state("loading")
    Health.ok = False
    assert get(base + "/readyz") == (503, "engine not ready (loading)\n")
    Health.ok = True
    assert get(base + "/readyz") == (200, "ready\n")
    code, body = get(base + "/status")
    assert code == 200
    assert json.loads(body)["effective_mode"] == "NONE"
    code, body = get(base + "/metrics")
    assert code == 200
    assert 'npu_graph_mode_info{effective="NONE",requested="FULL_DECODE_ONLY"} 1.0' in body
    alive[0] = False
    assert get(base + "/healthz")[0] == 503  # the engine process is gone
    assert get(base + "/nope")[0] == 404
    status.set_state("stopping")
    assert get(base + "/readyz")[0] == 503


# ----- listening: IPv4 and IPv6, a taken port vs an address that cannot be bound -----

UNASSIGNABLE = "192.0.2.1"  # TEST-NET-1: never an address of this machine (EADDRNOTAVAIL)


@pytest.fixture(scope="module")
def ipv6() -> None:
    """Skips only where the kernel has no IPv6 (no ::1 to bind)."""
    if not socket.has_ipv6:
        pytest.skip("Python was built without IPv6")
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        if exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
            pytest.skip(f"the kernel has no IPv6 here ({exc.strerror})")
        raise


def listening(host: str) -> socket.socket:
    squatter = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind((host, 0))
    squatter.listen()
    return squatter


@pytest.mark.parametrize("host", ["::1", "::"])
def test_the_metrics_server_listens_on_ipv6(ipv6: None, host: str, tmp_path: Path, engine_health: str) -> None:
    status = RuntimeStatus(str(tmp_path), "FULL_DECODE_ONLY")
    metrics_server = MetricsServer(status, host=host, port=0, engine_alive=lambda: True, health_url=engine_health)
    metrics_server.start()
    try:
        assert get(f"http://[::1]:{metrics_server.port}/healthz") == (200, "ok\n")
        if host == "::":  # the wildcard takes IPv4 too (kubelet probes and scrapes may come over either)
            assert get(f"http://127.0.0.1:{metrics_server.port}/healthz") == (200, "ok\n")
    finally:
        metrics_server.close()


def test_local_address_is_ready_for_a_url() -> None:
    assert local_address("0.0.0.0") == "127.0.0.1"
    assert local_address("") == "127.0.0.1"
    assert local_address("::") == "[::1]"
    assert local_address("[::]") == "[::1]"
    assert local_address("::1") == "[::1]"
    assert local_address("fd00::5") == "[fd00::5]"
    assert local_address("10.0.0.7") == "10.0.0.7"


def test_a_taken_port_is_port_in_use(ipv6: None) -> None:
    for host in ("127.0.0.1", "::1"):
        with listening(host) as squatter:
            port = squatter.getsockname()[1]
            with pytest.raises(ServeError) as caught:
                check_port_free(host, port, "API")
        assert caught.value.exit_code == EXIT_FAILED
        assert caught.value.failure.reason == failures.PORT_IN_USE
        assert f"API port {port} on {host} is taken" in caught.value.failure.message
        check_port_free(host, port, "API")  # free again: no error


def test_an_address_that_cannot_be_bound_is_not_port_in_use() -> None:
    with pytest.raises(ServeError) as caught:
        check_port_free(UNASSIGNABLE, 8000, "API")
    assert caught.value.exit_code == EXIT_INVALID
    assert caught.value.failure.reason == failures.INVALID_CONFIGURATION
    assert caught.value.failure.message.startswith(f"--host {UNASSIGNABLE} --port 8000: cannot listen")
    with pytest.raises(ServeError) as caught:
        check_port_free("no-such-host.invalid", 8000, "API")
    assert caught.value.failure.reason == failures.INVALID_CONFIGURATION


def supervisor(host: str, metrics_port: int) -> Supervisor:
    return Supervisor(ServeOptions(model="/models/m", host=host, metrics_port=metrics_port), environ={})


def test_serve_starts_its_metrics_server_on_ipv6(ipv6: None) -> None:
    run = supervisor("::", 0)
    try:
        run.start_server()
        assert run.server is not None
        assert get(f"http://[::1]:{run.server.port}/healthz") == (200, "ok\n")
        assert run.health_url == "http://[::1]:8000/health"
    finally:
        run.close()


def test_serve_tells_a_taken_metrics_port_from_an_unusable_address() -> None:
    with listening("127.0.0.1") as squatter:
        port = squatter.getsockname()[1]
        run = supervisor("127.0.0.1", port)
        try:
            with pytest.raises(ServeError) as caught:
                run.start_server()
        finally:
            run.close()
    assert (caught.value.failure.reason, caught.value.exit_code) == (failures.PORT_IN_USE, EXIT_FAILED)
    assert f"metrics port {port} on 127.0.0.1 is taken" in caught.value.failure.message
    run = supervisor(UNASSIGNABLE, 9090)
    try:
        with pytest.raises(ServeError) as caught:
            run.start_server()
    finally:
        run.close()
    assert (caught.value.failure.reason, caught.value.exit_code) == (failures.INVALID_CONFIGURATION, EXIT_INVALID)
    assert caught.value.failure.message.startswith(f"--host {UNASSIGNABLE} --metrics-port 9090: cannot listen")


def test_a_capture_failure_is_served_until_it_was_read_once() -> None:
    """The runtime lingers after a capture failure until /status was read in the failed state:
    then the operator's calibration record knows the size; bounded, and a stop ends it at once."""
    run = supervisor("127.0.0.1", 0)
    try:
        run.start_server()
        assert run.server is not None
        base = f"http://127.0.0.1:{run.server.port}"
        get(base + "/status")
        assert not run.server.failure_read.is_set()  # not failed yet: a read teaches nothing
        run.fail(failures.Failure(failures.GRAPH_CAPTURE_OOM, "capturing size 8: out of memory"))
        began = time.monotonic()
        assert run.wait_until_failure_read(0.3) is False  # nobody read it: bounded
        assert 0.3 <= time.monotonic() - began < 5
        reader = threading.Timer(0.2, get, (base + "/status",))
        reader.start()
        assert run.wait_until_failure_read(30) is True
        reader.join()
        run.server.failure_read.clear()
        run.stop_requested.set()
        began = time.monotonic()
        assert run.wait_until_failure_read(30) is False  # SIGTERM: no lingering
        assert time.monotonic() - began < 10  # not the 30 s bound (a margin for a loaded machine)
    finally:
        run.close()


def test_the_image_shell_setup_reaches_the_engine_in_a_cann_image_only() -> None:
    jemalloc = "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"
    image = {launch.CANN_HOME, jemalloc, launch.IMAGE_LIBRARY_DIR}
    env = launch.image_shell_env(
        {"LD_PRELOAD": "/opt/x.so", "LD_LIBRARY_PATH": "/usr/local/Ascend/driver/lib64"},
        exists=image.__contains__,
        machine="aarch64",
    )
    assert env["LD_PRELOAD"] == f"{jemalloc}:/opt/x.so"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/Ascend/driver/lib64:/usr/local/lib"
    # Already there (the user's own, or a second run): nothing added twice.
    assert launch.image_shell_env(env, exists=image.__contains__, machine="aarch64") == env
    # Not a CANN image (this machine's CPU engine): unchanged.
    outside = {jemalloc, launch.IMAGE_LIBRARY_DIR}
    assert launch.image_shell_env({"A": "1"}, exists=outside.__contains__, machine="aarch64") == {"A": "1"}
    # No jemalloc in the image: LD_PRELOAD is left alone.
    bare = {launch.CANN_HOME}
    assert "LD_PRELOAD" not in launch.image_shell_env({}, exists=bare.__contains__, machine="x86_64")
