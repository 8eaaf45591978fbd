"""Benchmark: the bytes per resource of what the operator keeps for one generation of a spec.

For N copies of examples/sandbox-cpu.yaml (distinct names and uids), tracemalloc measures what
stays allocated for: the typed spec (`api.parse_spec`), the stamped manifests as parsed objects
(what the operator kept before `children.CompactManifests`), the same manifests as
`CompactManifests` (what it keeps now) and the whole per-resource cache (`reconcile.DesiredCache`,
spec, manifests, claim and keys). Prints KiB per resource; the operator's peak RSS is measured by
scripts/bench_operator.py.

    .venv/bin/python scripts/bench_desired_memory.py [--resources 300]
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _part in ("operator", "runtime"):
    if str(ROOT / _part) not in sys.path:
        sys.path.insert(0, str(ROOT / _part))

import yaml  # noqa: E402
from npu_operator.api.config import OperatorConfig  # noqa: E402
from npu_operator.api.spec import parse_spec  # noqa: E402
from npu_operator.children import kinds as children  # noqa: E402
from npu_operator.controller import desired as reconcile  # noqa: E402

SANDBOX_MODELS = ("/tmp/npu-sandbox/models",)  # the example's hostPath source, allowed as the sandbox does


def kept_bytes(make: Callable[[dict[str, Any]], Any], bodies: list[dict[str, Any]]) -> float:
    """Bytes per body that stay allocated while the results of `make` are kept."""
    gc.collect()
    before = tracemalloc.take_snapshot()
    kept = [make(body) for body in bodies]
    gc.collect()
    after = tracemalloc.take_snapshot()
    size = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    del kept
    return size / len(bodies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", type=int, default=300)
    args = parser.parse_args()
    config = OperatorConfig(allowed_host_paths=SANDBOX_MODELS)
    document = yaml.safe_load((ROOT / "examples" / "sandbox-cpu.yaml").read_text())
    bodies = []
    for index in range(args.resources):
        body = copy.deepcopy(document)
        body["metadata"] = {
            "name": f"bench-{index:04d}",
            "namespace": "default",
            "uid": f"uid-{index}",
            "generation": 1,
        }
        bodies.append(body)
    served: frozenset[str] = frozenset()

    def parsed(body: dict[str, Any]) -> dict[str, Any]:
        """The manifests as the operator kept them before: the builders' objects, stamped."""
        compact = children.CompactManifests
        children.CompactManifests = dict  # type: ignore[misc,assignment]
        try:
            return dict(reconcile.desired_state(body, config, served).manifests)
        finally:
            children.CompactManifests = compact  # type: ignore[misc]

    def cache(body: dict[str, Any]) -> reconcile.DesiredCache:
        kept = reconcile.DesiredCache()
        kept.get(body, config, served, {})
        return kept

    tracemalloc.start()
    rows = [
        ("typed spec (api.parse_spec)", kept_bytes(lambda body: parse_spec(body["spec"]), bodies)),
        ("stamped manifests, parsed objects (before)", kept_bytes(parsed, bodies)),
        (
            "stamped manifests, children.CompactManifests (now)",
            kept_bytes(lambda body: reconcile.desired_state(body, config, served).manifests, bodies),
        ),
        ("the whole per-generation cache (reconcile.DesiredCache)", kept_bytes(cache, bodies)),
    ]
    print(f"{args.resources} resources of examples/sandbox-cpu.yaml (a Deployment and a Service each)\n")
    print("| kept per resource | KiB |\n| --- | --- |")
    for what, size in rows:
        print(f"| {what} | {size / 1024:.1f} |")


if __name__ == "__main__":
    main()
