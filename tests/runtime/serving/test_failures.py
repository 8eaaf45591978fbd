"""The failure-cause parser on real engine output (tests/runtime/serving/data/errors), and the one-line format."""

from __future__ import annotations

from pathlib import Path

import pytest
from npu_runtime.serving import failures
from npu_runtime.serving.failures import Failure, FailureScanner, classify

ERRORS = Path(__file__).parent / "data" / "errors"


def engine_output(name: str) -> list[str]:
    """A captured log without its provenance header (lines starting with '#')."""
    return [line for line in (ERRORS / name).read_text(encoding="utf-8").splitlines() if not line.startswith("#")]


@pytest.mark.parametrize(
    ("log", "reason", "excerpt"),
    [
        ("vllm_ascend_207005_alloc_sq_cq_fail.log", failures.STREAM_RESOURCES, "207005"),
        ("vllm_ascend_207008_stream_resources.log", failures.STREAM_RESOURCES, "stream resources are insufficient"),
        ("vllm_cuda_capture_end_oom.log", failures.GRAPH_CAPTURE_OOM, "CUDA error: out of memory"),
        ("vllm_ascend_npu_oom_load.log", failures.DEVICE_OOM, "NPU out of memory"),
        ("vllm_cpu_port_in_use.log", failures.PORT_IN_USE, "Address already in use"),
        ("vllm_cpu_model_missing.log", failures.MODEL_NOT_FOUND, "/tmp/does-not-exist"),
        ("vllm_cpu_broken_config.log", failures.MODEL_INVALID, "not a valid JSON file"),
        ("vllm_cpu_unsupported_architecture.log", failures.MODEL_UNSUPPORTED, "FooBarForCausalLM"),
    ],
)
def test_real_engine_output_is_classified(log: str, reason: str, excerpt: str) -> None:
    failure = classify(engine_output(log), exit_code=1)
    assert failure.reason == reason
    assert excerpt in failure.message


def test_stream_exhaustion_wins_over_the_memory_wording_of_207005() -> None:
    # ACL's 207005 text says "Failed to apply for memory"; the cause is SQ/CQ (stream) exhaustion.
    lines = engine_output("vllm_ascend_207005_alloc_sq_cq_fail.log")
    assert any("Failed to apply for memory" in line for line in lines)
    assert classify(lines, 1).reason == failures.STREAM_RESOURCES


def test_out_of_memory_is_a_capture_failure_when_the_observer_saw_capturing() -> None:
    lines = engine_output("vllm_ascend_npu_oom_load.log")
    assert classify(lines, 1).reason == failures.DEVICE_OOM
    assert classify(lines, 1, capturing=True).reason == failures.GRAPH_CAPTURE_OOM


def test_info_and_warning_lines_never_decide_a_cause() -> None:
    lines = [
        "(APIServer pid=1) WARNING 12-02 10:14:44 [system_utils.py:249] Found ulimit of 20000 ... Too many open files",
        "(Worker pid=2) INFO 12-02 10:15:09 [model_runner.py:1456] If out of memory occurs during capture, lower it",
        "INFO:     Shutting down",
    ]
    failure = classify(lines, 1)
    assert failure.reason == failures.ENGINE_EXITED


def test_python_source_lines_in_a_traceback_are_not_taken_for_the_error() -> None:
    lines = [
        "Traceback (most recent call last):",
        '  File "/x/vllm/worker.py", line 10, in run',
        '    if "out of memory" in str(error):',
        "ValueError: something else entirely",
    ]
    assert classify(lines, 1).reason == failures.ENGINE_EXITED


def test_anything_else_keeps_the_last_engine_lines() -> None:
    lines = [f"(EngineCore pid=7) ERROR 12-02 10:00:{i:02d} [core.py:1] step {i}" for i in range(40)]
    failure = classify(lines, 3)
    assert failure.reason == failures.ENGINE_EXITED
    assert failure.message.startswith("the engine exited with code 3; last lines:")
    assert "step 39" in failure.message
    assert "step 0 " not in failure.message
    assert "(EngineCore pid=7)" not in failure.message  # the log prefix is dropped


def test_a_signal_death_is_named() -> None:
    assert "killed by SIGKILL" in classify([], -9).message


def test_the_line_is_one_line_and_fits_the_kubernetes_limit() -> None:
    lines = [f"ERROR: line {i} " + "é" * 300 for i in range(200)]
    line = classify(lines, 1).line()
    assert "\n" not in line
    assert len(line.encode()) <= failures.MAX_LINE_BYTES < 4096
    assert line.startswith("EngineExited: ...")  # the tail is what is kept
    assert line.encode().decode() == line  # not cut inside a character


def test_a_multiline_message_becomes_one_line() -> None:
    assert Failure("ModelInvalid", "first\n\nsecond  \n").line() == "ModelInvalid: first | second"


def test_every_reason_is_camel_case() -> None:
    for reason in failures.REASONS:
        assert reason[0].isupper()
        assert reason.isalnum()


def test_scanner_streams_and_counts_capture_frames() -> None:
    scanner = FailureScanner(tail=5)
    for line in engine_output("vllm_cuda_capture_end_oom.log"):
        scanner.feed(line + "\n")
    assert scanner.capture_context
    assert len(scanner.tail) == 5


def test_termination_message_goes_to_stderr_and_to_an_explicit_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "termination-log"
    failures.write_termination_message(
        Failure("PortInUse", "API port 8000 is taken"), str(target), default_path="/dev/termination-log"
    )
    assert target.read_text() == "PortInUse: API port 8000 is taken\n"
    assert capsys.readouterr().err == "PortInUse: API port 8000 is taken\n"


def test_the_default_path_is_written_only_where_it_exists(tmp_path: Path) -> None:
    missing = tmp_path / "termination-log"
    failures.write_termination_message(Failure("X", "y"), str(missing), default_path=str(missing))
    assert not missing.exists()
