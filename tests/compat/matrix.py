"""The compatibility matrix: each observer hook and each planner rule x each supported engine release.

    python -m tests.compat.matrix        # downloads what is not cached yet, prints the matrix

A hook's cell is `binds` (every target it wraps is where the hook expects it, with what it reads;
"without x" names an optional parameter or attribute that release lacks), `missing (what)`,
`inherited` (the class uses its base's method, hooked there), `not here` (an optional target:
model runner v2 or vllm-ascend's runner variants) or `n/a` (the release has no vllm_ascend).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from npu_runtime.engines import RELEASES, EngineRelease
from npu_runtime.observer import compat as resolve
from npu_runtime.observer import targets
from npu_runtime.planner import modes, releases

from tests.compat import sources


@dataclass(frozen=True)
class Matrix:
    releases: tuple[EngineRelease, ...]
    hooks: dict[str, list[resolve.Cell]]  # hook -> one cell per release
    targets: dict[str, list[resolve.Cell]]  # "hook @ module.Class.method" -> one cell per release
    rules: dict[str, list[resolve.Cell]]  # "Reason: module symbol" -> one cell per release
    # "step: module symbol" -> one cell per release: the functions planner/releases.py cites, checked
    # in every release (a release's own row must bind them all: test_engine_releases).
    capture_rules: dict[str, list[resolve.Cell]] = dataclasses.field(default_factory=dict)


def release_source(release: EngineRelease) -> resolve.Source:
    """The release's unpacked sources (raises sources.SourceUnavailable when they cannot be had)."""
    roots: list[Path] = [sources.fetch(name, version) for name, version in release.distributions]
    return resolve.Source(roots)


def build(supported: tuple[EngineRelease, ...] = RELEASES) -> Matrix:
    loaded = [release_source(release) for release in supported]
    target_rows = {
        f"{t.hook} @ {t.qualname}": [resolve.check_target(source, t) for source in loaded] for t in targets.TARGETS
    }
    hooks = {
        hook: [
            resolve.combine([resolve.check_target(source, t) for t in targets.TARGETS if t.hook == hook])
            for source in loaded
        ]
        for hook in targets.HOOKS
    }
    rules = {
        f"{rule.reason}: {module}.{symbol}": [resolve.check_citation(source, module, symbol) for source in loaded]
        for rule in modes.RULES
        for module, symbol in resolve.citations(rule)
    }
    capture_rules = {
        f"{step}: {module}.{symbol}": [resolve.check_citation(source, module, symbol) for source in loaded]
        for step, module, symbol in capture_citations()
    }
    return Matrix(supported, hooks, target_rows, rules, capture_rules)


def capture_citations() -> list[tuple[str, str, str]]:
    """(step, module, symbol) of every function planner/releases.py's rows cite, once each."""
    found: dict[tuple[str, str, str], None] = {}
    for row in releases.RULES.values():
        for step, text in row.sources.items():
            for path, symbol in resolve.CITATION.findall(text):
                found[(step, path.replace("/", "."), symbol)] = None
    return list(found)


def render(matrix: Matrix) -> str:
    names = [release.name + (" [image default]" if release.default else "") for release in matrix.releases]
    lines: list[str] = []
    for title, rows in (
        ("hook", matrix.hooks),
        ("hook target", matrix.targets),
        ("planner rule (modes.RULES) citation", matrix.rules),
        ("capture-size step (releases.RULES) citation", matrix.capture_rules),
    ):
        width = max(len(title), *(len(row) for row in rows))
        lines.append(" | ".join([title.ljust(width), *names]))
        lines.append("-" * (width + sum(len(name) + 3 for name in names)))
        for row, cells in rows.items():
            lines.append(" | ".join([row.ljust(width), *(str(cell) for cell in cells)]))
        lines.append("")
    return "\n".join(lines)


def markdown(matrix: Matrix) -> str:
    """The hook rows as the Markdown table docs/serve.md shows (a test keeps the two equal)."""
    names = [release.name + (" (image default)" if release.default else "") for release in matrix.releases]
    lines = ["| hook | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines += [f"| {hook} | " + " | ".join(str(cell) for cell in cells) + " |" for hook, cells in matrix.hooks.items()]
    return "\n".join(lines)


def main() -> int:
    result = build()
    print(render(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
