"""The channel from the graph observer (inside vLLM's processes) to the runtime: one JSON file per process.

Each engine process that loaded the observer writes `observer-<pid>.json` into the directory
named by `NPU_GRAPH_OBSERVER_DIR` (a fresh directory the runtime makes per run), replacing it
atomically (write a temporary file, then rename), so a reader sees either the old or the new
report, never half of one. The runtime reads all of them for /status and /metrics.

Why files rather than prometheus_client's multiprocess mode: setting PROMETHEUS_MULTIPROC_DIR
for the engine would switch vLLM's own /metrics (port 8000) to the multiprocess registry and
publish our npu_* series there too, so a PodMonitor scraping both ports would count them twice;
and /status needs the same data in structured form anyway. One small JSON file per process,
rewritten at most once a second while something changes, serves both.

Report schema (version 1), every key optional except schema and pid:

    {"schema": 1, "pid": int, "process": str, "vllm_version": str|null, "updated": float,
     "phase": "loaded"|"capturing"|"captured",
     "config_mode": {"requested": str, "final": str}|null,   # VllmConfig, API server
     "resolved_mode": str|null,                               # CompilationConfig, workers
     "downgrades": [{"from_mode", "to_mode", "reason", "message", "stage": "engine"}],
     "captures": [{"mode", "size", "memory_bytes": int|null, "seconds", "graphs": int}],
     "replay": [{"mode", "size", "count", "timed", "sum_seconds", "buckets": [int],
                 "p50_seconds": float|null, "p99_seconds": float|null}],
     "eager_fallbacks": {reason: int}, "decode_steps": int,
     "decode_batches": {"counts": {"<tokens>": int}, "weights": {"<tokens>": float},
                        "dropped": int, "half_life_seconds": float},   # observer/batches.py
     "errors": {hook: int}, "hooks": {"installed": [str], "unavailable": [str]},
     "memory": {"device": str, "total"|"free"|"weights"|"kv_cache"|"graphs": int}|null}

Pure standard library: the observer imports this inside the engine, the runtime outside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Final

SCHEMA: Final = 1
ENV_DIR: Final = "NPU_GRAPH_OBSERVER_DIR"
ENV_ENABLED: Final = "NPU_GRAPH_OBSERVER"  # "0", "false" or "off" disables the plugin
ENV_SAMPLE_EVERY: Final = "NPU_GRAPH_OBSERVER_REPLAY_SAMPLE_EVERY"  # time 1 replay in N (default 1)
ENV_FLUSH_SECONDS: Final = "NPU_GRAPH_OBSERVER_FLUSH_SECONDS"  # report period (default 1.0)
# The decode batch distribution's half-life in seconds (default 3600, observer/batches.py)
ENV_BATCH_HALF_LIFE_SECONDS: Final = "NPU_GRAPH_OBSERVER_BATCH_HALF_LIFE_SECONDS"
PLUGIN_NAME: Final = "npu_graph_observer"
_PREFIX: Final = "observer-"


def report_path(directory: str | Path, pid: int) -> Path:
    return Path(directory) / f"{_PREFIX}{pid}.json"


def write_report(directory: str | Path, pid: int, report: dict[str, Any]) -> None:
    """Atomically replace this process's report."""
    target = report_path(directory, pid)
    fd, tmp = tempfile.mkstemp(prefix=f".{_PREFIX}{pid}.", suffix=".tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(report, handle, separators=(",", ":"), sort_keys=True)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_reports(directory: str | Path | None) -> list[dict[str, Any]]:
    """Every readable report in `directory`, ordered by pid; unreadable or foreign files are skipped."""
    if directory is None:
        return []
    reports: list[dict[str, Any]] = []
    try:
        paths = sorted(Path(directory).glob(f"{_PREFIX}*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA and isinstance(data.get("pid"), int):
            reports.append(data)
    reports.sort(key=lambda report: int(report["pid"]))
    return reports
