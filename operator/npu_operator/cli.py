"""`npu-operator run` (the operator) and `npu-operator render` (the children, without a cluster)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from npu_runtime.files import FileProblem, read_text

from npu_operator.api import crd
from npu_operator.api.config import ConfigError, OperatorConfig, load_config, python_log_level
from npu_operator.children.kinds import Capabilities
from npu_operator.controller import supervision
from npu_operator.controller.desired import adopted_children, read_spec

# Children rendered off-cluster have no owner uid yet: the API server assigns it.
PLACEHOLDER_UID: Final = "00000000-0000-0000-0000-000000000000"
EXIT_INVALID: Final = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="npu-operator", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the operator against the current cluster")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    render = commands.add_parser("render", help="print the children of NPUInference manifests, as applied")
    render.add_argument("-f", "--filename", required=True, type=Path, help="a YAML file of NPUInference objects")
    render.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    render.add_argument("--pod-monitor-api", action="store_true", help="render as if PodMonitors were served")
    render.add_argument("--keda-api", action="store_true", help="render as if KEDA's ScaledObjects were served")
    render.add_argument(
        "--inference-pool-api", action="store_true", help="render as if InferencePools (and HTTPRoutes) were served"
    )
    render.add_argument("--all-apis", action="store_true", help="render as if every optional API were served")
    args = parser.parse_args(argv)
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"npu-operator: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.command == "render":
        capabilities = (
            Capabilities.everything()
            if args.all_apis
            else Capabilities(
                pod_monitor=args.pod_monitor_api,
                scaled_object=args.keda_api,
                inference_pool=args.inference_pool_api,
                http_route=args.inference_pool_api,
            )
        )
        return _render(args.filename, args.output, config, capabilities)
    return run_operator(config, verbose=args.verbose)


# Python's default (700, 10, 10) collects the young generation every 700 allocations and, as the
# heap grows, the whole heap again and again: at 5,000 resources 15% of the operator's CPU went to
# the collector, mostly to full collections over kopf's bodies and indexes and the desired
# manifests, which live as long as their resource and are freed by reference counting, not by it.
GC_THRESHOLDS: Final = (50_000, 20, 10)


def long_lived_heap() -> None:
    """Tell the collector that the operator's heap is long-lived: what the imports made is frozen
    (never traversed again), and collections come once per 50,000 allocations, not 700."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_operator(config: OperatorConfig, *, verbose: bool = False) -> int:
    import npu_operator.controller.handlers  # noqa: F401  (registers the handlers)

    long_lived_heap()

    if verbose:  # the startup handler sets the level from the config: one place decides it
        config = dataclasses.replace(config, log_level="DEBUG")
    logging.basicConfig(level=python_log_level(config), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    return asyncio.run(supervision.run_supervised(config, liveness_endpoint=liveness))


def _render(path: Path, output: str, config: OperatorConfig, capabilities: Capabilities) -> int:
    try:
        documents = [doc for doc in yaml.safe_load_all(read_text(path)) if doc is not None]
    except FileProblem as exc:
        print(f"npu-operator render: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except yaml.YAMLError as exc:
        print(f"npu-operator render: {path}: not YAML: {exc}", file=sys.stderr)
        return EXIT_INVALID
    children: list[dict[str, Any]] = []
    failed = False
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            failed = True
            print(f"{path}[{index}]: a YAML {type(document).__name__}, not an object", file=sys.stderr)
            continue
        meta = document.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        where = f"{path}[{index}] {document.get('kind')}/{name}"
        if document.get("apiVersion") != crd.API_VERSION or document.get("kind") != crd.KIND:
            print(f"{where}: skipped, not an {crd.API_VERSION} {crd.KIND}", file=sys.stderr)
            continue
        errors = crd.validate(document)
        spec, problems = read_spec(document, config) if not errors else (None, [])
        errors += [str(problem) for problem in problems]
        if errors or spec is None:
            failed = True
            print(f"{where}: invalid", *(f"  {error}" for error in errors), sep="\n", file=sys.stderr)
            continue
        meta = document["metadata"]
        owner = {**document, "metadata": {**meta, "uid": meta.get("uid", PLACEHOLDER_UID)}}
        children += adopted_children(owner, spec, config, capabilities)
    if not crd.cel_available():
        print("npu-operator render: cel-python is not installed, CEL rules were not checked", file=sys.stderr)
    if output == "json":
        print(json.dumps(children, indent=2, sort_keys=True))
    else:
        print(yaml.safe_dump_all(children, sort_keys=True, default_flow_style=False), end="")
    return EXIT_INVALID if failed else 0


if __name__ == "__main__":
    sys.exit(main())
