#!/usr/bin/env python3
"""Time `.ci/run` from a fresh clone, phase by phase, on a quiet machine or under a bounded load.

    python3 scripts/ci_time.py                       # one run on this machine as it is
    python3 scripts/ci_time.py --load 2 --runs 3     # three runs, each beside two busy processes
    python3 scripts/ci_time.py --source /path/to/checkout --keep

Each run clones the committed tip of --source (default: this checkout) into a new temporary
folder, runs `bash .ci/run` there with CI=true and no standard input, as CI does, and stamps every
line it prints. The phases are cut at the markers `scripts/test` prints:

    install        from the start to "== ruff" (scripts/bootstrap: the venv, pip, helm/kubectl)
    ruff           "== ruff" to "== mypy"
    mypy           "== mypy" to "== lint-imports"
    lint-imports   "== lint-imports" to the first "== pytest"
    tests          "== pytest: the tests that start no engine" to the next marker
    engine tests   "== pytest: the engine tests" to the end

--load N starts N busy processes (a Python loop each, at normal priority) before the first run
and stops them after the last, or after --load-limit seconds, whichever comes first: the
"busy machine" CI meets when other work shares its two cores. The table prints each run's seconds
per phase, its exit status and the whole run's time; the script exits non-zero if any run failed.
Each run's full output is kept in <clone>/ci.log (--keep keeps the clone too, else it is deleted).
Nothing but a git clone and the project's own install is touched: pip's cache (~/.cache/pip) is
used as on any run on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PHASES = (
    ("install", None),
    ("ruff", "== ruff"),
    ("mypy", "== mypy"),
    ("lint-imports", "== lint-imports"),
    ("tests", "== pytest: the tests that start no engine"),
    ("engine tests", "== pytest: the engine tests"),
)
BUSY_LOOP = "import time\nwhile True:\n    time.monotonic()\n"


@dataclass
class Run:
    """One `.ci/run`: when each phase started, how it ended, where its log is."""

    log: Path
    starts: dict[str, float] = field(default_factory=dict)
    end: float = 0.0
    status: int = 0
    tail: list[str] = field(default_factory=list)

    def seconds(self) -> dict[str, float]:
        """Seconds per phase reached; a phase lasts until the next one that started."""
        reached = [(name, self.starts[name]) for name, _ in PHASES if name in self.starts]
        out: dict[str, float] = {}
        for index, (name, start) in enumerate(reached):
            stop = reached[index + 1][1] if index + 1 < len(reached) else self.end
            out[name] = stop - start
        return out


def phase_of(line: str) -> str | None:
    """The phase a marker line opens, or None for any other line."""
    for name, marker in PHASES:
        if marker is not None and line.startswith(marker):
            return name
    return None


def run_ci(source: Path, keep: bool) -> Run:
    """Clone source's committed tip and run its .ci/run, stamping the phases."""
    folder = Path(tempfile.mkdtemp(prefix="ci-time-"))
    clone = folder / "clone"
    subprocess.run(["git", "clone", "-q", str(source), str(clone)], check=True)
    run = Run(log=folder / "ci.log")
    env = {**os.environ, "CI": "true"}
    start = time.monotonic()
    run.starts["install"] = 0.0
    with open(run.log, "w") as log:
        proc = subprocess.Popen(
            ["bash", ".ci/run"],
            cwd=clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic() - start
            log.write(f"[{now:8.1f}] {line}")
            name = phase_of(line)
            if name is not None and name not in run.starts:
                run.starts[name] = now
                print(f"  [{now:7.1f}s] {name}", flush=True)
            run.tail = [*run.tail[-14:], line.rstrip()]
        run.status = proc.wait()
    run.end = time.monotonic() - start
    if not keep:
        shutil.rmtree(clone, ignore_errors=True)
    return run


@contextlib.contextmanager
def busy_processes(count: int, limit_seconds: float) -> Iterator[None]:
    """count busy loops for at most limit_seconds, always stopped on the way out."""
    procs = [
        subprocess.Popen(["timeout", str(int(limit_seconds)), sys.executable, "-c", BUSY_LOOP], start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def table(runs: list[Run]) -> str:
    """Phases as rows, runs as columns (m:ss), then the total and the exit status."""
    header = ["phase"] + [f"run {i + 1}" for i in range(len(runs))]
    rows = [header]
    for name, _ in PHASES:
        rows.append([name] + [minutes(r.seconds()[name]) if name in r.seconds() else "-" for r in runs])
    rows.append(["total"] + [minutes(r.end) for r in runs])
    rows.append(["exit status"] + [str(r.status) for r in runs])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the checkout whose committed tip is cloned (default: this one)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs one after the other (default 1)")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs (default 0)")
    parser.add_argument(
        "--load-limit",
        type=float,
        default=3 * 3600.0,
        help="seconds after which the busy processes stop in any case (default 3 h)",
    )
    parser.add_argument("--keep", action="store_true", help="keep each run's clone")
    args = parser.parse_args(argv)
    runs: list[Run] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    with busy_processes(args.load, args.load_limit):
        for index in range(args.runs):
            print(
                f"== run {index + 1}/{args.runs} of .ci/run from a fresh clone of {args.source}"
                f" ({args.load} busy processes beside it)",
                flush=True,
            )
            run = run_ci(args.source, args.keep)
            runs.append(run)
            print(f"   exit {run.status} after {minutes(run.end)}; log {run.log}", flush=True)
            if run.status != 0:
                print("\n".join("   | " + line for line in run.tail), flush=True)
    print(
        f"\n.ci/run from fresh clones, started {started}, {os.cpu_count()} cores, "
        f"{args.load} busy processes beside it\n"
    )
    print(table(runs))
    return 0 if all(r.status == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
