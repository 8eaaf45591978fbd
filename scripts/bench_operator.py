"""Benchmark: the real operator against the API emulator at N resources, next to a minimal kopf floor.

For each N, in the same run, on a fresh emulator each time:
- `npu-operator`: `python -m npu_operator.cli run` in its own process (the code on --operator-path,
  so the same script measures an older checkout too), talking to the emulator over HTTP;
- `floor`: the smallest kopf operator that creates the same Deployment and Service per resource
  (this script with --serve-floor): the cost of kopf itself on this machine. Both log in through
  `connection_info` (through the kubernetes package), so both carry it.
Printed per run: settle time (from the first of N creates, once the operator watches NPUInferences,
until all N have `status.observedGeneration` 1, which the floor writes once its handler has applied
both children), the operator's requests per resource to settle, its
requests per settled resource per resync interval while nothing happens, its CPU seconds and peak
RSS, and (ours only) the latency from a child's change to the resource's status showing it, p50 and
p95 over samples: a Deployment turning Ready, a pod going into CrashLoopBackOff.

    python scripts/bench_operator.py                       # N = 10, 100, 1000
    python scripts/bench_operator.py --sizes 10,100 --operator-path /tmp/old/operator

The emulator runs in this process; its CPU seconds are printed too, to show when it, rather than
the operator, is the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import os
import resource
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parents[1]
for _part in ("operator", "runtime", "sandbox"):
    if str(ROOT / _part) not in sys.path:
        sys.path.insert(0, str(ROOT / _part))

NS = "default"
CLIENT_AGENT = "npu-sandbox"  # this script's own requests (LocalCluster's User-Agent): not the operator's


def _proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_peak_rss_mb(pid: int, field: str = "VmHWM") -> float:
    """The process's peak resident memory (VmHWM), or with field="VmRSS" its resident memory now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@functools.cache
def _example() -> dict[str, Any]:
    import yaml

    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "sandbox-cpu.yaml").read_text())
    return document


def _manifest(index: int) -> dict[str, Any]:
    """The example under the index's name (parsed once: the creates are timed, the YAML parser is not ours)."""
    document = copy.deepcopy(_example())
    document["metadata"] = {"name": f"bench-{index:04d}", "namespace": NS}
    return document


def _operator_requests(emulator: Any, start: int = 0) -> int:
    return sum(
        1 for request in emulator.history[start:] if not request.headers.get("User-Agent", "").startswith(CLIENT_AGENT)
    )


def _watching(emulator: Any, plural: str) -> bool:
    """Whether the operator has opened its watch of `plural`."""
    return any(
        request.params.get("watch") == "true" and request.url.path.endswith(f"/{plural}")
        for request in emulator.history
        if not request.headers.get("User-Agent", "").startswith(CLIENT_AGENT)
    )


def _stored(emulator: Any, plural: str, name: str) -> dict[str, Any] | None:
    for (resource_, namespace, obj_name), obj in emulator.objects.items():
        if resource_.plural == plural and namespace == NS and obj_name == name and not obj.deleted:
            raw: dict[str, Any] = obj.raw
            return raw
    return None


def _all(emulator: Any, plural: str) -> dict[str, dict[str, Any]]:
    return {
        name: obj.raw
        for (resource_, namespace, name), obj in emulator.objects.items()
        if resource_.plural == plural and namespace == NS and not obj.deleted
    }


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in (obj or {}).get("status", {}).get("conditions", []):
        if item.get("type") == kind:
            found: dict[str, Any] = item
            return found
    return {}


def _settled(obj: Any) -> bool:
    """Our status, or the floor's one field of it, written for generation 1."""
    return bool((obj.get("status") or {}).get("observedGeneration") == 1)


async def _until(probe: Any, within: float, interval: float = 0.02) -> float | None:
    """Seconds until `probe()` is true, or None after `within`."""
    started = time.perf_counter()
    while time.perf_counter() - started < within:
        if probe():
            return time.perf_counter() - started
        await asyncio.sleep(interval)
    return None


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def run_one(which: str, size: int, args: argparse.Namespace, *, traced: bool = False) -> dict[str, Any]:
    """One timed run; `traced`: under tracemalloc (not timed: it is several times slower), with the
    memory breakdown of the settled operator (`breakdown`) in the row."""
    from npu_operator.api import crd
    from npu_sandbox.cluster import LocalCluster, operator_process

    async with LocalCluster() as cluster:
        emulator = cluster.emulator
        env = operator_process.operator_env(
            cluster.kubeconfig,
            operator_path=Path(args.operator_path),
            NPU_OPERATOR_RESYNC_SECONDS=str(args.resync),
            NPU_OPERATOR_STATUS_POLL_SECONDS=str(args.resync),
        )
        snapshot = cluster.workdir / "snapshot.pickle"
        if traced:
            env[SNAPSHOT_ENV] = str(snapshot)
            command = [sys.executable, str(SCRIPT), "--serve-traced", which]
        elif which == "npu-operator":
            command = [sys.executable, "-m", "npu_operator.cli", "run"]
        else:
            command = [sys.executable, str(SCRIPT), "--serve-floor"]
        # The emulator compiles the CRD's schema and CEL rules on the first write it validates (about
        # 0.6 s here, cached for the process): paid here, not inside whichever run comes first.
        await cluster.create(_manifest(0), crd.PLURAL, dry_run=True)
        log_path = cluster.workdir / "operator.log"
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(*command, env=env, stdout=log, stderr=log)
        emulator_cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        try:
            # The operator imports, logs in and starts its watches: settle time counts from its
            # first watch of NPUInferences (an apply to a running operator), as for the floor.
            await asyncio.sleep(args.warmup)
            watching = await _until(lambda: _watching(emulator, crd.PLURAL), args.timeout, interval=0.1)
            if process.returncode is not None or watching is None:
                raise RuntimeError(f"{which} did not start:\n" + log_path.read_text(errors="replace")[-3000:])
            if traced:  # the baseline: the operator as it is before any resource
                process.send_signal(signal.SIGUSR1)
                if await _until(snapshot.with_suffix(".baseline").exists, 600, interval=0.5) is None:
                    raise RuntimeError(f"{which} wrote no baseline")
            names = [f"bench-{i:04d}" for i in range(size)]
            requests0 = len(emulator.history)
            started = time.perf_counter()
            for index in range(size):
                await cluster.create(_manifest(index), crd.PLURAL)

            def settled_count() -> int:
                stored = _all(emulator, crd.PLURAL)
                return sum(_settled(stored.get(name) or {}) for name in names)

            # A poll reads every stored NPUInference in this process (the emulator's): every 0.2 s at
            # 1,000, every 10 ms at 10, so the poll neither starves the emulator nor rounds N=10 up.
            poll = max(0.01, 0.2 * size / 1000)
            waited = await _until(lambda: settled_count() == size, args.timeout, interval=poll)
            settle = time.perf_counter() - started if waited is not None else None
            settled = settled_count()
            to_settle = _operator_requests(emulator, requests0)
            await asyncio.sleep(args.grace)
            idle0 = len(emulator.history)
            await asyncio.sleep(args.idle_resyncs * args.resync)
            idle = _operator_requests(emulator, idle0)
            latencies: dict[str, list[float]] = {"deployment ready": [], "pod failing": []}
            if which == "npu-operator" and settle is not None and not traced:
                latencies = await _latencies(cluster, names[: args.samples], args)
            peak_rss = _proc_peak_rss_mb(process.pid)
            settled_rss = _proc_peak_rss_mb(process.pid, "VmRSS")
            cpu = _proc_cpu_seconds(process.pid)
            memory: list[tuple[str, float]] = []
            if traced:
                process.send_signal(signal.SIGUSR1)
                if await _until(snapshot.exists, 600, interval=0.5) is None:
                    raise RuntimeError(f"{which} wrote no snapshot:\n" + log_path.read_text(errors="replace")[-3000:])
                memory = breakdown(snapshot, size)
        finally:
            await operator_process.stop(process)
        emulator_cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        errors = log_path.read_text(errors="replace").splitlines()
        tail = [line for line in errors if "Traceback" in line or "ERROR" in line]
        if tail:
            print(*errors[-40:], sep="\n", file=sys.stderr)
        return {
            "which": which,
            "n": size,
            "settle": settle,
            "settled": settled,
            "to_settle": to_settle / size,
            "idle": idle / size / args.idle_resyncs,
            "cpu": cpu,
            "rss": peak_rss,
            "settled_rss": settled_rss,
            "emulator_cpu": (emulator_cpu1.ru_utime + emulator_cpu1.ru_stime)
            - (emulator_cpu0.ru_utime + emulator_cpu0.ru_stime),
            "latencies": latencies,
            "errors": len(tail),
            "memory": memory,
        }


async def _latencies(cluster: Any, names: list[str], args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds from a child's change to the resource's status showing it, one sample per name."""
    from npu_operator.api import crd
    from npu_sandbox.controllers.workloads import replica_set_owner

    emulator = cluster.emulator
    ready: list[float] = []
    failing: list[float] = []
    for name in names:
        deployment = _stored(emulator, "deployments", name)
        assert deployment is not None
        replicas = deployment["spec"]["replicas"]
        await cluster.report_deployment(NS, name, deployment["metadata"]["generation"], replicas, replicas)
        took = await _until(
            lambda n=name: _condition(_stored(emulator, crd.PLURAL, n), "Ready").get("status") == "True", 60
        )
        ready.append(took if took is not None else float("inf"))
    for name in names:
        # A pod of the Deployment's ReplicaSet: the operator reads only pods whose owner chain leads
        # to its workload (made before the timed step, as the deployment controller would have).
        owner = await replica_set_owner(cluster, NS, name)
        meta = {"name": f"{name}-pod", "namespace": NS, "labels": _pod_labels(name), "ownerReferences": [owner]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"containers": [{"name": "runtime", "image": "x"}]},
        }
        await cluster.create(pod, "pods")  # the API server drops a status sent with a create
        crash_looping = {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "runtime",
                    "restartCount": 3,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                }
            ],
        }
        await cluster.patch("v1", "pods", NS, f"{name}-pod", {"status": crash_looping}, subresource="status")
        took = await _until(
            lambda n=name: _condition(_stored(emulator, crd.PLURAL, n), "Degraded").get("status") == "True", 60
        )
        failing.append(took if took is not None else float("inf"))
    return {"deployment ready": ready, "pod failing": failing}


def _pod_labels(name: str) -> dict[str, str]:
    from npu_operator.kube import names as kube_names

    return kube_names.selector_labels(name)


def report(rows: list[dict[str, Any]], label: str) -> None:
    print(f"\n## {label}\n")
    print(
        "| N | operator | settled | settle s | requests/resource to settle | idle requests/resource/resync "
        "| operator CPU s | peak RSS MB | emulator CPU s | Ready latency p50/p95 s | pod failure latency p50/p95 s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        settle = f"{row['settle']:.2f}" if row["settle"] is not None else "not settled"
        cells = []
        for key in ("deployment ready", "pod failing"):
            values = row["latencies"].get(key) or []
            cells.append(f"{statistics.median(values):.2f} / {_percentile(values, 0.95):.2f}" if values else "-")
        print(
            f"| {row['n']} | {row['which']} | {row['settled']}/{row['n']} | {settle} | {row['to_settle']:.1f} "
            f"| {row['idle']:.2f} | {row['cpu']:.1f} | {row['rss']:.0f} | {row['emulator_cpu']:.1f} "
            f"| {cells[0]} | {cells[1]} |" + (f" ({row['errors']} error lines)" if row["errors"] else "")
        )


# --- where the memory goes: the operator (or the floor) under tracemalloc, a snapshot on SIGUSR1 ---

TRACE_FRAMES = 16
SNAPSHOT_ENV = "BENCH_OPERATOR_SNAPSHOT"


def serve_traced(which: str) -> None:
    """Run `which` (npu-operator or floor) with tracemalloc on; SIGUSR1 writes a snapshot and a
    census of the per-resource structures (`heap_census`) to $BENCH_OPERATOR_SNAPSHOT."""
    import gc
    import pickle
    import tracemalloc

    path = Path(os.environ[SNAPSHOT_ENV])
    baseline: list[Any] = []

    def dump(*_: Any) -> None:
        """The first signal: the baseline, before any resource; the second: the snapshot and the census."""
        gc.collect()
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if not baseline:
            baseline.append(snapshot)
            path.with_suffix(".baseline").touch()
            return
        partial = path.with_suffix(".partial")
        partial.write_bytes(pickle.dumps((snapshot.compare_to(baseline[0], "traceback"), heap_census())))
        partial.replace(path)

    signal.signal(signal.SIGUSR1, dump)
    tracemalloc.start(TRACE_FRAMES)
    if which == "floor":
        serve_floor()
        return
    from npu_operator.cli import main as operator_main

    sys.exit(operator_main(["run"]))


def _owner(traceback: Any) -> str:
    """Who allocated a block: the newest frame in npu_operator, else in kopf, else the newest package's."""
    frames = list(reversed(traceback))  # newest first
    for frame in frames:
        for package in ("npu_operator", "kopf"):
            marker = f"/{package}/"
            if marker in frame.filename:
                module = frame.filename.rsplit(marker, 1)[1].removesuffix(".py").replace("/", ".")
                if module not in ("cli", "controller.supervision"):  # the entry, under everything
                    return f"{package}.{module}"
    name = frames[0].filename if frames else "?"
    if "site-packages/" in name:
        return name.split("site-packages/", 1)[1].split("/", 1)[0]
    return Path(name).stem


def heap_census() -> dict[str, tuple[int, int]]:
    """Bytes and objects reachable from each per-resource structure, in this order, each object
    counted once (for the first structure that reaches it): our informers' caches (one per kind),
    the workers' state of each resource (part by part) and their queue, kopf's per-object
    memories, and every task's coroutine frames."""
    import asyncio
    import gc
    import types

    from kopf._core.reactor import inventory

    stop_types: tuple[type, ...] = (
        types.ModuleType,
        type,
        types.FunctionType,
        types.BuiltinFunctionType,
        types.MethodType,
        asyncio.AbstractEventLoop,
        logging_types(),
    )
    seen: set[int] = set()
    stoppers = {id(obj) for obj in gc.get_objects() if type(obj).__name__ in ("OperatorSettings", "KubeClient", "Memo")}

    def size(root: Any) -> tuple[int, int]:
        total, count, stack = 0, 0, [root]
        while stack:
            obj = stack.pop()
            if id(obj) in seen or id(obj) in stoppers or isinstance(obj, stop_types):
                continue
            seen.add(id(obj))
            total += sys.getsizeof(obj)
            count += 1
            if isinstance(obj, types.CoroutineType):
                frame = obj.cr_frame
                if frame is not None:
                    stack.extend(frame.f_locals.values())
                if obj.cr_await is not None:
                    stack.append(obj.cr_await)
                continue
            if isinstance(obj, types.FrameType | asyncio.Task | asyncio.Future):
                continue
            stack.extend(gc.get_referents(obj))
        return total, count

    census: dict[str, tuple[int, int]] = {}
    objects = gc.get_objects()
    memories = [obj for obj in objects if isinstance(obj, inventory.ResourceMemories)]
    for informers in (obj for obj in objects if type(obj).__name__ == "Informers"):
        for kind, cache in informers.sinks().items():
            census[f"ours: the informers' cache of {kind.plural}"] = size(cache)
    # The workers' state of each resource, part by part, then the rest of the workers (the queue).
    workers = [obj for obj in objects if type(obj).__name__ == "Workers"]
    states = [state for found in workers for state in found.states.values()]
    parts: dict[str, Callable[[Any], Any]] = {
        "body.metadata": lambda state: state.body["metadata"],
        "body.spec": lambda state: state.body["spec"],
        "known_status": lambda state: state.known_status,
        "cache": lambda state: state.cache,
        "the rest": lambda state: state,
    }
    for part, of in parts.items():
        census[f"ours: resource states: {part}"] = _add(size(of(state)) for state in states)
    census["ours: the workers' queue and the rest"] = _add(size(obj) for obj in workers)
    census["kopf per-object memories (one per object watched)"] = _add(size(obj) for obj in memories)
    # Each task's chain of awaited coroutines: every frame's locals by function, then the tasks themselves.
    tasks = list(asyncio.all_tasks(asyncio.get_event_loop()))
    chains = []
    for task in tasks:
        chain: list[Any] = []
        link: Any = task.get_coro()
        while isinstance(link, types.CoroutineType | types.AsyncGeneratorType):
            chain.append(link)
            link = getattr(link, "cr_await", None) or getattr(link, "ag_await", None)
        chains.append(list(reversed(chain)))
    for chain in chains:
        for coro in chain:
            frame = getattr(coro, "cr_frame", None)
            if frame is None:
                continue
            where = f"{Path(frame.f_code.co_filename).parent.name}/{Path(frame.f_code.co_filename).name}"
            label = f"frames: {where} {frame.f_code.co_name}"
            census[label] = _add([census.get(label, (0, 0)), *(size(value) for value in frame.f_locals.values())])
    census["tasks and their coroutines, the rest"] = _add(size(task) for task in tasks)
    return census


def logging_types() -> type:
    import logging

    return logging.Logger


def _add(sizes: Any) -> tuple[int, int]:
    total, count = 0, 0
    for size, n in sizes:
        total, count = total + size, count + n
    return total, count


def breakdown(path: Path, size: int, top: int = 14) -> list[tuple[str, float]]:
    """KB per resource by owner (tracemalloc: what was allocated since the baseline and is still
    held, by who allocated it) and by structure (the census: who holds it), from a snapshot file."""
    import pickle

    differences, census = pickle.loads(path.read_bytes())
    owners: dict[str, int] = {}
    for difference in differences:
        owner = _owner(difference.traceback)
        owners[owner] = owners.get(owner, 0) + difference.size_diff
    rows = [(f"allocated in {owner}", total / size / 1000) for owner, total in owners.items()]
    rows.sort(key=lambda row: -row[1])
    rows = [("all the operator holds since the baseline", sum(owners.values()) / size / 1000), *rows[:top]]
    held = [(f"held by {name}", total / size / 1000) for name, (total, _) in census.items() if total / size >= 50]
    rows += sorted(held, key=lambda row: -row[1])
    return rows


def report_memory(rows: list[dict[str, Any]]) -> None:
    """Memory per resource above the same run's floor (peak RSS, and RSS once settled and idle: after
    the idle window and the latency samples), and each traced run's breakdown."""
    timed = {(row["which"], row["n"]): row for row in rows if not row["memory"]}
    lines = []
    for (which, size), row in timed.items():
        floor = timed.get(("floor", size))
        if which == "npu-operator" and floor is not None:
            above = (row["rss"] - floor["rss"]) * 1000 / size
            settled_above = (row["settled_rss"] - floor["settled_rss"]) * 1000 / size
            settle = (row["settle"] or float("nan")) / (floor["settle"] or float("nan"))
            lines.append(
                f"| {size} | {floor['rss']:.0f} / {floor['settled_rss']:.0f} "
                f"| {row['rss']:.0f} / {row['settled_rss']:.0f} "
                f"| {above:.1f} | {settled_above:.1f} | {settle:.2f}x | {row['cpu'] / floor['cpu']:.2f}x |"
            )
    if lines:
        print("\n## Memory above the floor\n")
        print(
            "| N | floor RSS MB, peak / settled | ours RSS MB, peak / settled | KB/resource above the floor, peak "
            "| settled | settle ours/floor | CPU ours/floor |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        print(*lines, sep="\n")
    for row in rows:
        if row["memory"]:
            print(f"\n## Where the memory goes: {row['which']} at N={row['n']} (tracemalloc, KB per resource)\n")
            print("| owner | KB/resource |")
            print("| --- | --- |")
            for owner, kb in row["memory"]:
                print(f"| {owner} | {kb:.1f} |")


def serve_floor() -> None:
    """The floor: on create, apply the same Deployment and Service and say so in the status; nothing else, ever."""
    import logging

    import kopf
    from npu_operator.api import crd
    from npu_operator.api.config import OperatorConfig
    from npu_operator.api.spec import parse_spec
    from npu_operator.children import kinds as children
    from npu_operator.children import workloads
    from npu_operator.kube.client import KubeClient, connection_info

    config = OperatorConfig()

    @kopf.on.startup()
    async def start(settings: kopf.OperatorSettings, memo: Any, logger: Any, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=crd.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=crd.GROUP)
        memo.client = KubeClient(lambda: connection_info(settings, logger))

    @kopf.on.cleanup()
    async def stop(memo: Any, **_: Any) -> None:
        await memo.client.close()

    @kopf.on.login()
    def login(settings: kopf.OperatorSettings, logger: Any, **_: Any) -> kopf.ConnectionInfo:
        return connection_info(settings, logger)

    @kopf.on.create(crd.GROUP, crd.VERSION, crd.PLURAL, id="create_children")
    async def create_children(body: kopf.Body, patch: kopf.Patch, memo: Any, **_: Any) -> None:
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        spec = parse_spec(body.get("spec", {}))
        made = [workloads.build_deployment(name, namespace, spec, config), workloads.build_service(name, namespace)]
        kopf.adopt(made, owner=body)
        for child in made:
            await memo.client.apply(children.kind_of(child, name).resource, namespace, child)
        # Written with kopf's own patch after the handler (a field the CRD's status schema has).
        patch.status["observedGeneration"] = body["metadata"]["generation"]

    logging.basicConfig(level=logging.WARNING)
    asyncio.run(kopf.operator(clusterwide=True, standalone=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--operator-path", default=str(ROOT / "operator"), help="the npu_operator to measure")
    parser.add_argument("--label", default="", help="a title for the table")
    parser.add_argument("--only", choices=("npu-operator", "floor"), help="run one of the two")
    parser.add_argument("--resync", type=float, default=10.0, help="the operator's resync and status poll, s")
    parser.add_argument("--idle-resyncs", type=int, default=2, help="resync intervals watched while idle")
    parser.add_argument("--samples", type=int, default=20, help="latency samples per kind of change")
    parser.add_argument("--timeout", type=float, default=600.0, help="settle deadline, s")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--grace", type=float, default=3.0, help="after settling, before the idle window, s")
    parser.add_argument(
        "--breakdown", action="store_true", help="also run each N under tracemalloc: where the memory goes"
    )
    parser.add_argument("--serve-floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-traced", choices=("npu-operator", "floor"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor()
        return
    if args.serve_traced:
        serve_traced(args.serve_traced)
        return
    rows = []
    for size in (int(part) for part in args.sizes.split(",")):
        for which in ("npu-operator", "floor"):
            if args.only in (None, which):
                row = asyncio.run(run_one(which, size, args))
                rows.append(row)
                print(row, file=sys.stderr, flush=True)
        if args.breakdown:
            for which in ("npu-operator", "floor"):
                if args.only in (None, which):
                    rows.append(asyncio.run(run_one(which, size, args, traced=True)))
    report([row for row in rows if not row["memory"]], args.label or f"operator from {args.operator_path}")
    report_memory(rows)


if __name__ == "__main__":
    main()
