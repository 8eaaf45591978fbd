"""Resolve the observer's targets and the planner's rules in an engine's source, by AST.

`Source` reads the Python files of one engine release (unpacked from its published archive by
tests/compat, or installed in the image for `npu-runtime doctor`) without importing them, so it
needs no device, no CANN and no torch: modules by path, classes and functions by name (following `from x import y`
re-exports, as `vllm.config` has), base classes, methods' signatures, and the attributes a class
has (class-level assignments and annotations, properties and methods, `self.x = ...` in any of its
methods, and the same on its bases). `check_target` turns one `targets.Target` into a `Cell` of
the matrix with the same `targets.check_parameters` the hooks use at patch time.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from npu_runtime.observer.targets import Read, Target, check_parameters
from npu_runtime.planner.modes import Rule

MAX_DEPTH: Final = 8

Found = tuple[str, ast.ClassDef]  # (module, class definition)


class Source:
    """The Python sources of one release: directories that hold `vllm/` and/or `vllm_ascend/`."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = list(roots)
        self._trees: dict[str, ast.Module | None] = {}

    def packages(self) -> set[str]:
        return {package for root in self.roots for package in ("vllm", "vllm_ascend") if (root / package).is_dir()}

    def path(self, module: str) -> Path | None:
        parts = module.split(".")
        for root in self.roots:
            base = root.joinpath(*parts)
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.path(module)
            self._trees[module] = ast.parse(path.read_text(encoding="utf-8"), str(path)) if path else None
        return self._trees[module]

    def _imported(self, module: str, name: str) -> Iterator[tuple[str, str]]:
        """(module, name) that `name` is imported from at the top level of `module` (also under if/try)."""
        tree = self.tree(module)
        if tree is None:
            return
        package = module if (self.path(module) or Path()).name == "__init__.py" else module.rpartition(".")[0]
        for node in _top_level(tree.body):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    source = ".".join([*base, source] if source else base)
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        yield source, alias.name
                        yield f"{source}.{alias.name}", ""  # a submodule imported by name

    def find_class(self, module: str, name: str, depth: int = 0) -> Found | None:
        tree = self.tree(module)
        if tree is None or depth > MAX_DEPTH:
            return None
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for source, imported in self._imported(module, name):
            if imported:
                found = self.find_class(source, imported, depth + 1)
                if found is not None:
                    return found
        return None

    def has_function(self, module: str, name: str, depth: int = 0) -> bool:
        tree = self.tree(module)
        if tree is None or depth > MAX_DEPTH:
            return False
        for node in _top_level(tree.body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return True
        return any(
            imported and self.has_function(source, imported, depth + 1)
            for source, imported in self._imported(module, name)
        )

    def bases(self, found: Found) -> list[Found]:
        module, cls = found
        result: list[Found] = []
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if name is None:
                continue
            resolved = self.find_class(module, name)
            if resolved is not None and resolved[1] is not cls:
                result.append(resolved)
        return result

    def method(self, found: Found, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        for node in found[1].body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
        return None

    def has_attribute(self, found: Found, name: str, depth: int = 0) -> bool:
        if depth > MAX_DEPTH:
            return False
        cls = found[1]
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return True
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                return True
            if isinstance(node, ast.Assign) and any(_assigns_name(target, name) for target in node.targets):
                return True
        for inner in ast.walk(cls):
            targets: list[ast.expr] = []
            if isinstance(inner, ast.Assign):
                targets = list(inner.targets)
            elif isinstance(inner, ast.AnnAssign | ast.AugAssign):
                targets = [inner.target]
            if any(_assigns_self_attribute(target, name) for target in targets):
                return True
        return any(self.has_attribute(base, name, depth + 1) for base in self.bases(found))


def _top_level(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking into if/try blocks (TYPE_CHECKING, optional imports)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
        else:
            yield node


def _assigns_name(target: ast.expr, name: str) -> bool:
    if isinstance(target, ast.Name):
        return target.id == name
    if isinstance(target, ast.Tuple | ast.List):
        return any(_assigns_name(element, name) for element in target.elts)
    return False


def _assigns_self_attribute(target: ast.expr, name: str) -> bool:
    if isinstance(target, ast.Attribute):
        return isinstance(target.value, ast.Name) and target.value.id == "self" and target.attr == name
    if isinstance(target, ast.Tuple | ast.List):
        return any(_assigns_self_attribute(element, name) for element in target.elts)
    return False


def signature(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str]]:
    """(positional names after self, keyword-only names), as `targets.signature_names` gives at run time."""
    positional = [arg.arg for arg in [*function.args.posonlyargs, *function.args.args]]
    return positional[1:], [arg.arg for arg in function.args.kwonlyargs]


# ----- the matrix -----

BINDS: Final = "binds"
INHERITED: Final = "inherited"  # the class does not define the method: hooked on its base class
NOT_HERE: Final = "not here"  # an optional target the release does not have
NOT_APPLICABLE: Final = "n/a"  # the release does not ship that engine (vllm_ascend on the CPU build)
MISSING: Final = "missing"


@dataclass(frozen=True)
class Cell:
    status: str
    detail: str = ""  # what is missing, or what a binding hook reads without

    def __str__(self) -> str:
        return f"{self.status} ({self.detail})" if self.detail else self.status

    @property
    def missing(self) -> bool:
        return self.status == MISSING


def check_read(source: Source, read: Read) -> bool:
    if read.class_name is None:
        return source.has_function(read.module, read.name)
    found = source.find_class(read.module, read.class_name)
    return found is not None and source.has_attribute(found, read.name)


def check_target(source: Source, target: Target) -> Cell:
    if target.engine not in source.packages():
        return Cell(NOT_APPLICABLE)
    absent = Cell(NOT_HERE) if target.may_be_absent else None
    if source.tree(target.module) is None:
        return absent or Cell(MISSING, f"module {target.module}")
    found = source.find_class(target.module, target.class_name)
    if found is None:
        return absent or Cell(MISSING, f"class {target.class_name}")
    method = source.method(found, target.method)
    if method is None:
        if _inherits(source, found, target):
            return Cell(INHERITED)
        return absent or Cell(MISSING, f"method {target.class_name}.{target.method}")
    problem = check_parameters(*signature(method), target.params)
    if problem is not None:
        return Cell(MISSING, problem)
    without: list[str] = []
    for read in target.reads:
        if not check_read(source, read):
            owner = f"{read.class_name}.{read.name}" if read.class_name else f"{read.module}.{read.name}"
            if not read.optional:
                return Cell(MISSING, f"attribute {owner}" if read.class_name else f"function {owner}")
            without.append(owner)
    positional, keyword_only = signature(method)
    without += [p.name for p in target.params if p.optional and p.name not in (*positional, *keyword_only)]
    return Cell(BINDS, "without " + ", ".join(without) if without else "")


def _inherits(source: Source, found: Found, target: Target, depth: int = 0) -> bool:
    if depth > MAX_DEPTH:
        return False
    for base in source.bases(found):
        if source.method(base, target.method) is not None or _inherits(source, base, target, depth + 1):
            return True
    return False


def combine(cells: Sequence[Cell]) -> Cell:
    """A hook's cell from its targets' cells: missing if any is, else binds if any does."""
    for cell in cells:
        if cell.missing:
            return cell
    details = sorted({cell.detail for cell in cells if cell.status == BINDS and cell.detail})
    if any(cell.status == BINDS for cell in cells):
        return Cell(BINDS, "; ".join(details))
    if cells and all(cell.status == NOT_APPLICABLE for cell in cells):
        return Cell(NOT_APPLICABLE)
    if any(cell.status == INHERITED for cell in cells):
        return Cell(INHERITED)
    return Cell(NOT_HERE)


# ----- the planner's rules: every `source` citing "<path>.py <Symbol>" -----

CITATION: Final = re.compile(r"\b((?:vllm|vllm_ascend)/[\w/]+)\.py ([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)?)")


def citations(rule: Rule) -> list[tuple[str, str]]:
    """(module, symbol) for every function or method the rule's `source` names with its file."""
    return [(path.replace("/", "."), symbol) for path, symbol in CITATION.findall(rule.source)]


def check_citation(source: Source, module: str, symbol: str) -> Cell:
    if module.split(".", 1)[0] not in source.packages():
        return Cell(NOT_APPLICABLE)
    tree = source.tree(module)
    if tree is None:
        return Cell(MISSING, f"module {module}")
    owner, _, member = symbol.rpartition(".")
    if owner:
        found = source.find_class(module, owner)
        if found is None:
            return Cell(MISSING, f"class {owner}")
        return Cell(BINDS) if source.has_attribute(found, member) else Cell(MISSING, symbol)
    if source.has_function(module, symbol) or source.find_class(module, symbol) is not None:
        return Cell(BINDS)
    # A bare name may be a method of one of the module's classes (e.g. a platform's hook).
    for node in _top_level(tree.body):
        if isinstance(node, ast.ClassDef) and source.method((module, node), symbol) is not None:
            return Cell(BINDS)
    return Cell(MISSING, symbol)
