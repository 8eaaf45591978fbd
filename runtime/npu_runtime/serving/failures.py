"""Why the engine (or the runtime before it) failed, as one line with a stable reason code.

The line `<Reason>: <message>` goes to stderr and to the termination-message file, where the
kubelet puts it into the pod's `lastState.terminated.message` (at most 4096 bytes); /status
carries the same reason. Reason codes are a contract with the operator:

    GraphCaptureOutOfMemory    device OOM while graphs were being captured
    DeviceOutOfMemory          device OOM elsewhere (weights, KV cache, activations)
    StreamResourcesExhausted   Ascend ACL stream resources (207008, 207005, "Alloc sq cq fail")
    ModelNotFound              model path missing or unreadable
    ModelInvalid               model directory present but broken (config.json, weights)
    ModelUnsupported           architecture the engine does not serve
    ModelDoesNotFit            the planner found no plan that fits the device (exit 3)
    InvalidConfiguration       bad flags or planner input (exit 2); the message names the field
    PortInUse                  the API or metrics port is taken
    EngineExited               anything else; the message keeps the engine's last lines

`FailureScanner` watches the engine's output as it streams by (last matching line per rule,
plus a tail of recent lines) and classifies at exit. Patterns come from real error text (see
tests/runtime/serving/data/errors). Pure: no I/O but `write_termination_message`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, TextIO

GRAPH_CAPTURE_OOM: Final = "GraphCaptureOutOfMemory"
DEVICE_OOM: Final = "DeviceOutOfMemory"
STREAM_RESOURCES: Final = "StreamResourcesExhausted"
MODEL_NOT_FOUND: Final = "ModelNotFound"
MODEL_INVALID: Final = "ModelInvalid"
MODEL_UNSUPPORTED: Final = "ModelUnsupported"
MODEL_DOES_NOT_FIT: Final = "ModelDoesNotFit"
INVALID_CONFIGURATION: Final = "InvalidConfiguration"
PORT_IN_USE: Final = "PortInUse"
ENGINE_EXITED: Final = "EngineExited"

REASONS: Final = (
    GRAPH_CAPTURE_OOM,
    DEVICE_OOM,
    STREAM_RESOURCES,
    MODEL_NOT_FOUND,
    MODEL_INVALID,
    MODEL_UNSUPPORTED,
    MODEL_DOES_NOT_FIT,
    INVALID_CONFIGURATION,
    PORT_IN_USE,
    ENGINE_EXITED,
)

# Kubernetes keeps at most 4096 bytes of a termination message; stay well inside it.
MAX_LINE_BYTES: Final = 4000
TAIL_LINES: Final = 400  # kept from the engine's output
SHOWN_LINES: Final = 12  # of them, put into an EngineExited message

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "(EngineCore_DP0 pid=519998) ERROR 08-05 11:23:25 [core.py:632] " and "INFO:     " prefixes.
_LOG_PREFIX = re.compile(
    r"^(?:\([^)]*pid=\d+\)\s*)?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s?)?"
)
_QUIET_LEVEL = re.compile(r"^(?:\([^)]*pid=\d+\)\s*)?(?:DEBUG|INFO|WARNING)\s+\d\d-\d\d\s|^(?:INFO|WARNING):\s")


@dataclasses.dataclass(frozen=True)
class Failure:
    reason: str
    message: str

    def line(self) -> str:
        """`<Reason>: <message>` on one line, at most MAX_LINE_BYTES bytes of UTF-8."""
        message = " | ".join(part.strip() for part in self.message.splitlines() if part.strip())
        head = f"{self.reason}: "
        budget = MAX_LINE_BYTES - len(head.encode())
        return head + trim_bytes(message, budget, keep="end" if self.reason == ENGINE_EXITED else "start")

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message}


def trim_bytes(text: str, budget: int, *, keep: str = "start") -> str:
    """`text` cut to `budget` UTF-8 bytes, marking the cut with an ellipsis; `keep` the start or the end."""
    data = text.encode()
    if len(data) <= budget:
        return text
    marker = "..."
    room = max(0, budget - len(marker))
    if keep == "end":
        return marker + data[len(data) - room :].decode(errors="ignore")
    return data[:room].decode(errors="ignore") + marker


def clean(line: str) -> str:
    """A log line without colour codes and without vLLM's process/level/time/file prefix."""
    line = _ANSI.sub("", line).rstrip()
    return _LOG_PREFIX.sub("", line, count=1).strip()


@dataclasses.dataclass(frozen=True)
class _Rule:
    reason: str
    pattern: re.Pattern[str]
    hint: str
    # Also match traceback source lines and indented continuation lines (ACL's error details are
    # indented; Python source lines mentioning "out of memory" must not count as an OOM).
    indented: bool = False


# Order matters: the first rule with a match wins. Stream resources before OOM, because ACL's
# 207005 text says "Failed to apply for memory" while the cause is stream/SQ-CQ exhaustion.
_RULES: Final = (
    _Rule(
        STREAM_RESOURCES,
        re.compile(
            r"\b207008\b|\b207005\b|alloc sq cq fail|stream resources (?:are )?insufficient"
            r"|insufficient_stream_resources",
            re.IGNORECASE,
        ),
        "ACL graph capture ran out of NPU stream resources; capture fewer sizes (--capture-sizes or a "
        "lower --max-capture-size), use FULL_DECODE_ONLY, or upgrade HDK/CANN",
        indented=True,
    ),
    _Rule(
        DEVICE_OOM,
        re.compile(
            r"out of memory|OutOfMemoryError|No available memory for the cache blocks"
            r"|larger than the available KV cache memory|ACL_ERROR_RT_MEMORY_ALLOCATION",
            re.IGNORECASE,
        ),
        "lower --gpu-memory-utilization, --max-num-seqs or --max-model-len, or use more devices",
    ),
    _Rule(PORT_IN_USE, re.compile(r"Address already in use|\[Errno 98\]|EADDRINUSE"), ""),
    _Rule(
        MODEL_UNSUPPORTED,
        re.compile(
            r"are not supported for now|Model architectures? .* (?:is|are) not supported"
            r"|requires you to execute the configuration file|trust_remote_code=True",
            re.IGNORECASE,
        ),
        "",
    ),
    _Rule(
        MODEL_INVALID,
        re.compile(
            r"is not a valid JSON file|JSONDecodeError|Unrecognized model in|does not appear to have a file named"
            r"|Error while deserializing header|SafetensorError|HeaderTooLarge|Invalid repository ID",
            re.IGNORECASE,
        ),
        "",
    ),
    _Rule(
        MODEL_NOT_FOUND,
        re.compile(
            r"Repo id must be in the form|is not a local folder and is not a valid model identifier"
            r"|RepositoryNotFoundError",
            re.IGNORECASE,
        ),
        "",
    ),
)

# Frames and lines that place a failure inside graph capture.
_CAPTURE_CONTEXT: Final = re.compile(
    r"\bin (?:capture_model|_capture_cudagraphs|_warmup_and_capture|capture_begin|capture_end|capture)\b"
    r"|torch\.(?:cuda|npu)\.graph\(|CUDAGraphWrapper|ACLGraphWrapper|aclgraph|cuda_graph\.py|acl_graph\.py"
    r"|cudagraph_utils\.py|graph capture|capturing (?:cuda|acl)? ?graph",
    re.IGNORECASE,
)


class FailureScanner:
    """Feed it the engine's output line by line; ask it why the engine failed when it exits.

    Per rule it keeps the last matching line (the final exception message of a traceback comes
    after the frames), skipping INFO/WARNING log lines and traceback source lines.
    """

    def __init__(self, tail: int = TAIL_LINES) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self.last: dict[str, str] = {}
        self.capture_context = False

    def feed(self, line: str) -> None:
        line = _ANSI.sub("", line).rstrip("\r\n")
        if not line.strip():
            return
        self.tail.append(line)
        if _QUIET_LEVEL.match(line):
            return
        if _CAPTURE_CONTEXT.search(line):
            self.capture_context = True
        body = _LOG_PREFIX.sub("", line, count=1)
        indented = body.startswith("    ") or body.lstrip().startswith('File "')
        for rule in _RULES:
            if (rule.indented or not indented) and rule.pattern.search(line):
                self.last[rule.reason] = clean(line)
                break

    def feed_all(self, lines: Iterable[str]) -> FailureScanner:
        for line in lines:
            self.feed(line)
        return self

    def failure(self, exit_code: int | None, *, capturing: bool = False) -> Failure:
        """The cause of an engine exit; `capturing` when the observer saw the engine capturing graphs."""
        for rule in _RULES:
            seen = self.last.get(rule.reason)
            if seen is None:
                continue
            reason = rule.reason
            if reason == DEVICE_OOM and (capturing or self.capture_context):
                reason = GRAPH_CAPTURE_OOM
                hint = (
                    "graph capture ran out of device memory; capture fewer or smaller sizes "
                    "(--capture-sizes, --max-capture-size), or lower --gpu-memory-utilization to leave room"
                )
            else:
                hint = rule.hint
            message = seen if not hint else f"{seen} ({hint})"
            return Failure(reason, message)
        return Failure(ENGINE_EXITED, engine_exit_message(exit_code, self.tail))


def engine_exit_message(exit_code: int | None, lines: Sequence[str]) -> str:
    status = describe_exit(exit_code)
    shown = [clean(line) for line in list(lines)[-SHOWN_LINES:]]
    shown = [line for line in shown if line]
    if not shown:
        return f"the engine {status} without output"
    return f"the engine {status}; last lines: " + " | ".join(shown)


def describe_exit(exit_code: int | None) -> str:
    if exit_code is None:
        return "stopped"
    if exit_code < 0:
        try:
            import signal

            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"was killed by {name}"
    return f"exited with code {exit_code}"


def classify(lines: Iterable[str], exit_code: int | None, *, capturing: bool = False) -> Failure:
    """Classify a complete output at once (tests, and tools reading a saved log)."""
    return FailureScanner().feed_all(lines).failure(exit_code, capturing=capturing)


def write_termination_message(failure: Failure, path: str, *, default_path: str, stream: TextIO | None = None) -> None:
    """Print the cause to stderr and write it to `path`.

    The default path (/dev/termination-log) is written only where it exists, as in a pod; a
    path given explicitly is created.
    """
    line = failure.line()
    print(line, file=stream or sys.stderr, flush=True)
    target = Path(path)
    if path == default_path and not target.exists():
        return
    try:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        print(f"npu-runtime: cannot write the termination message to {path}: {exc}", file=sys.stderr)
