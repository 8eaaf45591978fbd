"""A Python process that sees only the distributions one extra of this project installs.

What `pip install "npu-inference[operator]"` puts into a fresh image is the dependency closure of
that extra. Instead of downloading it again into a new virtual environment on every test run
(network, tens of seconds), the closure is computed from the installed distributions' own
metadata, and a folder of symlinks to exactly those distributions' files becomes the only
`site-packages` of a Python started with `-I -S` (no site, no user site, no environment). A
module outside the closure (torch, vllm, celpy, transformers...) cannot be imported there, just
as in the image. The project's own packages come from the source tree, as the wheel has them.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "npu-inference"
ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "operator", ROOT / "runtime")


def closure(extras: Iterable[str]) -> set[str]:
    """Canonical names of the distributions `npu-inference[extras]` needs, itself excluded."""
    wanted: list[tuple[str, frozenset[str]]] = [(PROJECT, frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    while wanted:
        name, requested = wanted.pop()
        if (name, requested) in seen:
            continue
        seen.add((name, requested))
        names.add(canonicalize_name(name))
        for text in _requires(name):
            requirement = Requirement(text)
            marker = requirement.marker
            environments = [{"extra": extra} for extra in requested] or [{"extra": ""}]
            if marker is None or any(marker.evaluate(env) for env in environments):
                wanted.append((requirement.name, frozenset(requirement.extras)))
    return names - {canonicalize_name(PROJECT)}


def _requires(name: str) -> list[str]:
    """A distribution's requirements; this project's from its pyproject.toml (the installed metadata
    may be an older checkout's: the environment is shared by several work trees)."""
    if canonicalize_name(name) != canonicalize_name(PROJECT):
        return list(importlib.metadata.distribution(name).requires or [])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    texts = list(project.get("dependencies", []))
    for extra, requirements in project.get("optional-dependencies", {}).items():
        texts += [
            f"{text} and extra == {extra!r}" if ";" in text else f"{text}; extra == {extra!r}" for text in requirements
        ]
    return texts


def build_site(extras: Iterable[str], site: Path) -> set[str]:
    """Fill `site` with symlinks to the files of the closure's distributions; return their names."""
    site.mkdir(parents=True, exist_ok=True)
    names = closure(extras)
    for name in names:
        distribution = importlib.metadata.distribution(name)
        tops = {Path(str(file)).parts[0] for file in distribution.files or []}
        for top in tops:
            if top in ("..", "__pycache__") or (site / top).exists():
                continue
            source = Path(str(distribution.locate_file(top)))
            if source.exists():
                (site / top).symlink_to(source)
    return names


def run(extras: Iterable[str], site: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a Python that sees only the closure of `extras` and this project's sources."""
    build_site(extras, site)
    path = [str(site), *map(str, SOURCES)]
    prelude = f"import sys; sys.path[:0] = {path!r}; sys.argv[1:] = {list(args)!r}\n"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=site,
    )
