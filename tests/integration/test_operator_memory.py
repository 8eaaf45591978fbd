"""What a settled resource costs the operator in memory, measured with tracemalloc in its own process.

The real operator (`python -m npu_operator.cli run`) runs against the in-process API over HTTP under
tracemalloc (one frame: cheap, and only the total is read). On SIGUSR1 it writes the memory Python
holds, after a collection: once before any resource exists, once after N resources have settled.
The difference over N is what each settled resource holds: kopf's state for it and its children,
our indexes' entries, its worker. Not timed, and the same objects each run: the bound has a wide
margin and cannot flake. `scripts/bench_operator.py --breakdown` says where the bytes go, and its
peak RSS figures against the bare-kopf floor are in docs/operator.md.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from npu_operator.api import crd
from npu_sandbox.cluster import LocalCluster, operator_process

from tests.examples import example

RESOURCES = 40
# KB held per settled resource (the example's one-node resource: a Deployment, a Service and its
# calibration record), as this test measures it (kopf's share included, and the operator's one-time
# costs spread over 40): 71.6 on main at 6c53380, 52.0-53.6 after issue 36's second pass; 25.4-26.0
# with the children watched by our informers and the workers out of kopf's daemons (eighth pass).
# The bound leaves about 20% to spare and is far under the pass before's figure.
BOUND_KB = 32.0

TRACED_OPERATOR = """
import gc, os, signal, sys, tracemalloc
from pathlib import Path
out = Path(os.environ["TRACED_MEMORY_FILE"])
def dump(*_):
    gc.collect()
    with out.open("a") as f:
        f.write(f"{tracemalloc.get_traced_memory()[0]}\\n")
signal.signal(signal.SIGUSR1, dump)
tracemalloc.start(1)
from npu_operator.cli import main
sys.exit(main(["run"]))
"""


def manifest(index: int) -> dict[str, Any]:
    document = example("sandbox-cpu.yaml")
    document["metadata"] = {"name": f"memory-{index:03d}", "namespace": "default"}
    return document


def figures(out: Path) -> list[str]:
    return out.read_text().split() if out.exists() else []


async def traced_bytes(process: asyncio.subprocess.Process, out: Path, count: int) -> int:
    """Signal the operator and wait for its `count`-th figure."""
    process.send_signal(signal.SIGUSR1)
    for _ in range(600):
        lines = figures(out)
        if len(lines) >= count:
            return int(lines[count - 1])
        await asyncio.sleep(0.1)
    raise AssertionError("the operator wrote no figure")


async def test_a_settled_resource_holds_little_memory_in_the_operator() -> None:
    async with LocalCluster() as cluster:
        out = cluster.workdir / "traced"
        env = operator_process.operator_env(cluster.kubeconfig, TRACED_MEMORY_FILE=str(out))
        log = cluster.workdir / "operator.log"
        with log.open("wb") as stream:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", TRACED_OPERATOR, env=env, stdout=stream, stderr=stream
            )
        try:

            async def watching() -> bool:
                if process.returncode is not None:
                    raise AssertionError("the operator exited:\n" + log.read_text(errors="replace")[-3000:])
                return any(
                    request.params.get("watch") == "true" and request.url.path.endswith(f"/{crd.PLURAL}")
                    for request in cluster.emulator.history
                )

            await cluster.wait_for(watching, within=120, what="the operator watches NPUInferences")
            await asyncio.sleep(1)
            before = await traced_bytes(process, out, 1)
            for index in range(RESOURCES):
                await cluster.create(manifest(index), crd.PLURAL)

            async def settled() -> bool:
                items = await cluster.list_objects(crd.API_VERSION, crd.PLURAL, "default")
                return bool(
                    sum((item.get("status") or {}).get("observedGeneration") == 1 for item in items) == RESOURCES
                )

            await cluster.wait_for(settled, within=240, interval=0.5, what="every resource settled")
            await asyncio.sleep(6)  # kopf's per-object event workers end after 5 s without events
            after = await traced_bytes(process, out, 2)
        finally:
            await operator_process.stop(process)
        per_resource_kb = (after - before) / RESOURCES / 1000
        print(f"held per settled resource: {per_resource_kb:.1f} KB")
        assert per_resource_kb < BOUND_KB
