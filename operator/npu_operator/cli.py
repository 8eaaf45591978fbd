"""`npu-operator run` (the operator) and `npu-operator render` (the children, without a cluster).

`render` reads manifests as kubectl does (`-f FILE`, `-f DIR`, `-R`, `-f -`, several `-f`) and
decides with the operator's settings as a cluster's operator would (`--config`, `--set`, the
NPU_OPERATOR_* variables); a comment after the output names what optional APIs left out.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from npu_runtime.files import MAX_TEXT_BYTES, FileProblem, read_bounded, read_text

from npu_operator.api import crd
from npu_operator.api.config import ConfigError, OperatorConfig, load_config, python_log_level
from npu_operator.children import kinds
from npu_operator.children.kinds import JSON, Capabilities
from npu_operator.controller import supervision
from npu_operator.controller.desired import adopted_children, read_spec

# Children rendered off-cluster have no owner uid yet: the API server assigns it.
PLACEHOLDER_UID: Final = "00000000-0000-0000-0000-000000000000"
EXIT_INVALID: Final = 2
# `-f -` (and /dev/stdin) reads standard input, at most as much as `read_text` reads of a file.
STDIN_NAMES: Final = ("-", "/dev/stdin")
STDIN_LABEL: Final = "<stdin>"
MAX_INPUT_BYTES: Final = MAX_TEXT_BYTES
# What `-f DIR` reads of a directory, as kubectl does.
MANIFEST_SUFFIXES: Final = (".yaml", ".yml", ".json")


@dataclasses.dataclass(frozen=True)
class OptionalApi:
    """An optional API that `render` assumes served only when asked: its flag, the `Capabilities`
    fields it turns on, and the child kinds that are built only with it."""

    flag: str
    served: str
    capabilities: tuple[str, ...]
    kinds: tuple[str, ...]

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


OPTIONAL_APIS: Final = (
    OptionalApi("--pod-monitor-api", "PodMonitors", ("pod_monitor",), (kinds.POD_MONITOR.kind,)),
    OptionalApi("--keda-api", "KEDA's ScaledObjects", ("scaled_object",), (kinds.SCALED_OBJECT.kind,)),
    OptionalApi(
        "--inference-pool-api",
        "InferencePools (and HTTPRoutes)",
        ("inference_pool", "http_route"),
        (kinds.INFERENCE_POOL.kind, kinds.HTTP_ROUTE.kind),
    ),
    OptionalApi("--istio-api", "Istio's DestinationRules", ("destination_rule",), (kinds.DESTINATION_RULES.kind,)),
)
ALL_APIS: Final = "--all-apis"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load_config(file=args.config, assignments=args.set)
    except ConfigError as exc:
        print(f"npu-operator: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.command == "render":
        return _render(args.filename, args.recursive, args.output, config, _capabilities(args))
    return run_operator(config, verbose=args.verbose)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npu-operator", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the operator against the current cluster")
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.set_defaults(config=None, set=())  # the operator reads its settings from the environment only
    render = commands.add_parser("render", help="print the children of NPUInference manifests, as applied")
    render.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="a YAML or JSON file of NPUInference objects (a v1 List too), a directory of them, or - for"
        " standard input; repeatable",
    )
    render.add_argument("-R", "--recursive", action="store_true", help="read -f directories' subdirectories too")
    render.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    render.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the operator's settings file (camelCase keys), in place of the one NPU_OPERATOR_CONFIG names",
    )
    render.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one operator setting, by its chart value (operator.podTemplatePolicy.allowedHostPaths=/data/models)"
        " or settings-file key (allowedHostPaths=/data/models); lists comma-separated or as helm writes them"
        " ({a,b}); over the file and the NPU_OPERATOR_* variables; repeatable",
    )
    for api in OPTIONAL_APIS:
        render.add_argument(api.flag, action="store_true", help=f"render as if {api.served} were served")
    render.add_argument(ALL_APIS, action="store_true", help="render as if every optional API were served")
    return parser


def _capabilities(args: argparse.Namespace) -> Capabilities:
    if args.all_apis:
        return Capabilities.everything()
    served = [field for api in OPTIONAL_APIS if getattr(args, api.dest) for field in api.capabilities]
    return Capabilities(**dict.fromkeys(served, True))


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
    from npu_operator.controller import handlers  # kopf and its handlers: only for `run`

    long_lived_heap()

    if verbose:  # the startup handler sets the level from the config: one place decides it
        config = dataclasses.replace(config, log_level="DEBUG")
    logging.basicConfig(level=python_log_level(config), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    return asyncio.run(supervision.run_supervised(config, handlers.registry, liveness_endpoint=liveness))


def _render(
    names: Sequence[str], recursive: bool, output: str, config: OperatorConfig, capabilities: Capabilities
) -> int:
    try:
        objects = [found for label, text in read_inputs(names, recursive) for found in _objects(label, text)]
    except FileProblem as exc:
        print(f"npu-operator render: {exc}", file=sys.stderr)
        return EXIT_INVALID
    children: list[JSON] = []
    skipped: list[tuple[str, str]] = []
    failed = False
    for where, document in objects:
        built = _children(where, document, config, capabilities)
        if built is None:
            failed = True
        else:
            children += built[0]
            skipped += built[1]
    if not crd.cel_available():
        print("npu-operator render: cel-python is not installed, CEL rules were not checked", file=sys.stderr)
    note = skipped_note(skipped)
    if output == "json":
        print(json.dumps(children, indent=2, sort_keys=True))
        if note:
            print(note, file=sys.stderr)
    else:
        print(yaml.safe_dump_all(children, sort_keys=True, default_flow_style=False), end="")
        if note:
            print(note)
    return EXIT_INVALID if failed else 0


def read_inputs(names: Sequence[str], recursive: bool) -> list[tuple[str, str]]:
    """(label, text) of every file that the -f options name, in order: standard input for `-`, a
    directory's YAML and JSON files (its subdirectories' too when `recursive`); FileProblem if one
    cannot be read."""
    if sum(name in STDIN_NAMES for name in names) > 1:
        raise FileProblem(f"{STDIN_LABEL}: named more than once (it can be read once)")
    inputs: list[tuple[str, str]] = []
    for name in names:
        if name in STDIN_NAMES:
            inputs.append((STDIN_LABEL, read_stdin()))
        elif Path(name).is_dir():
            inputs += [(str(path), read_text(path)) for path in manifest_files(Path(name), recursive)]
        else:
            inputs.append((name, read_text(name)))
    return inputs


def read_stdin() -> str:
    """Standard input as UTF-8 text, refused beyond MAX_INPUT_BYTES: the bounds `read_text` keeps."""
    if sys.stdin is None:
        raise FileProblem(f"{STDIN_LABEL}: closed")
    return read_bounded(sys.stdin.buffer, STDIN_LABEL, limit=MAX_INPUT_BYTES)


def manifest_files(directory: Path, recursive: bool) -> list[Path]:
    """The .yaml, .yml and .json files of `directory`, by name, as kubectl's `-f DIR` reads them; with
    `recursive` its subdirectories' too (symbolic links to directories are not followed)."""
    found = _walk(directory, recursive)
    if not found:
        below = " or below it" if recursive else " (-R reads its subdirectories)"
        raise FileProblem(f"{directory}: no {', '.join(MANIFEST_SUFFIXES)} file in it{below}")
    return found


def _walk(directory: Path, recursive: bool) -> list[Path]:
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError as exc:
        raise FileProblem(f"{directory}: cannot list: {exc.strerror or exc}") from None
    found: list[Path] = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            found += _walk(Path(entry.path), recursive) if recursive else []
        elif entry.name.endswith(MANIFEST_SUFFIXES):
            found.append(Path(entry.path))
    return found


def _objects(label: str, text: str) -> list[tuple[str, Any]]:
    """The documents of one input, each with where it is (`file[index]`); a v1 List's items each."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise FileProblem(f"{label}: not YAML: {exc}") from None
    found: list[tuple[str, Any]] = []
    for index, document in enumerate(documents):
        where = f"{label}[{index}]"
        if isinstance(document, dict) and document.get("kind") == "List" and isinstance(document.get("items"), list):
            found += [(f"{where}.items[{number}]", item) for number, item in enumerate(document["items"])]
        else:
            found.append((where, document))
    return found


def _children(
    where: str, document: Any, config: OperatorConfig, capabilities: Capabilities
) -> tuple[list[JSON], list[tuple[str, str]]] | None:
    """The children of one NPUInference, and those left out for their optional APIs (each as the flag
    that includes it and Kind/name); None if it is invalid (said on stderr). Another kind of object
    is skipped with a line saying so."""
    if not isinstance(document, dict):
        print(f"{where}: a YAML {type(document).__name__}, not an object", file=sys.stderr)
        return None
    meta = document.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    where = f"{where} {document.get('kind')}/{name}"
    if document.get("apiVersion") != crd.API_VERSION or document.get("kind") != crd.KIND:
        print(f"{where}: skipped, not an {crd.API_VERSION} {crd.KIND}", file=sys.stderr)
        return [], []
    errors = crd.validate(document)
    spec, problems = read_spec(document, config) if not errors else (None, [])
    errors += [str(problem) for problem in problems]
    if errors or spec is None:
        print(f"{where}: invalid", *(f"  {error}" for error in errors), sep="\n", file=sys.stderr)
        return None
    meta = document["metadata"]
    owner = {**document, "metadata": {**meta, "uid": meta.get("uid", PLACEHOLDER_UID)}}
    rendered = adopted_children(owner, spec, config, capabilities)
    kept = {_name(child) for child in rendered}
    if capabilities == Capabilities.everything():
        return rendered, []
    every = adopted_children(owner, spec, config, Capabilities.everything())
    return rendered, [(_flag(child, meta["name"]), _name(child)) for child in every if _name(child) not in kept]


def _name(child: JSON) -> str:
    return f"{child['kind']}/{child['metadata']['name']}"


def _flag(child: JSON, owner: str) -> str:
    """The flags that render `child`: the one of its optional API and the one of the API it needs
    (both for the endpoint picker's PodMonitor), space-separated."""
    child_kind = kinds.kind_of(child, owner)
    needed = {child_kind.kind} if child_kind.optional else set()
    needed |= {child_kind.needs} if child_kind.needs else set()
    flags = [api.flag for api in OPTIONAL_APIS if needed & set(api.kinds)]
    return " ".join(flags) or ALL_APIS


def skipped_note(skipped: Sequence[tuple[str, str]]) -> str:
    """One comment line naming the children left out because their optional API was not assumed
    served, grouped by the flag that includes them ("" when none was left out)."""
    groups: dict[str, list[str]] = {}
    for flag, name in skipped:
        groups.setdefault(flag, []).append(name)
    if not groups:
        return ""
    listed = "; ".join(f"{', '.join(names)} ({flag})" for flag, names in groups.items())
    return f"# not rendered, their APIs not assumed served ({ALL_APIS} renders every one): {listed}"


if __name__ == "__main__":
    sys.exit(main())
