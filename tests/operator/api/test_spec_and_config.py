"""Operator settings and the checks beyond the schema: every error names its field."""

from __future__ import annotations

from pathlib import Path

import pytest
from npu_operator.api.config import ConfigError, OperatorConfig, load_config
from npu_operator.api.spec import parse_spec
from npu_operator.api.validation import extended_resource_problem, validate_spec

from tests.examples import example


def test_defaults_without_any_setting() -> None:
    assert load_config({}) == OperatorConfig()


def test_variables_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("runtimeImage: registry.local/rt:1\nnamespaces: [a, b]\nresyncSeconds: 10\n")
    config = load_config({"NPU_OPERATOR_CONFIG": str(path), "NPU_OPERATOR_RESYNC_SECONDS": "5"})
    assert config.runtime_image == "registry.local/rt:1"
    assert config.namespaces == ("a", "b")
    assert config.resync_seconds == 5.0


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"NPU_OPERATOR_RESYNC_SECONDS": "soon"}, "NPU_OPERATOR_RESYNC_SECONDS"),
        ({"NPU_OPERATOR_RESYNC_SECONDS": "0"}, "must be a positive number"),
        ({"NPU_OPERATOR_NPU_RESOURCE_NAME": "nvidia"}, "NPU_OPERATOR_NPU_RESOURCE_NAME: 'nvidia' is not an extended"),
        ({"NPU_OPERATOR_NAMESPACES": "ok,Not_OK"}, "'Not_OK' is not a namespace name"),
        ({"NPU_OPERATOR_LOG_LEVEL": "loud"}, "NPU_OPERATOR_LOG_LEVEL"),
        ({"NPU_OPERATOR_STANDALONE": "maybe"}, "must be true or false"),
        ({"NPU_OPERATOR_STATUS_CONCURRENCY": "0"}, "NPU_OPERATOR_STATUS_CONCURRENCY"),
        ({"NPU_OPERATOR_METRICS_PORT": "70000"}, "must be a port number"),
        ({"NPU_OPERATOR_RUNTIME_IMAGE": " "}, "must not be empty"),
        ({"NPU_OPERATOR_CONFIG": "/nonexistent/config.yaml"}, "cannot read"),
    ],
)
def test_a_bad_setting_is_named(environ: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        load_config(environ)
    assert fragment in str(caught.value)


def test_unknown_file_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("runtimeImg: x\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*runtimeImg"):
        load_config({"NPU_OPERATOR_CONFIG": str(path)})


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("huawei.com/Ascend910", None),
        ("huawei.com/Ascend310P", None),
        ("example.org/npu.v2", None),
        ("Ascend910", "not an extended resource name"),
        ("kubernetes.io/npu", "kubernetes.io domain"),
        ("node.kubernetes.io/npu", "kubernetes.io domain"),
        ("example.org/requests.npu", "reserved for quota"),
        ("Huawei.com/npu", "not an extended resource name"),
    ],
)
def test_extended_resource_names(name: str, fragment: str | None) -> None:
    problem = extended_resource_problem(name)
    assert (problem is None) if fragment is None else (fragment in (problem or ""))


def spec_with(**engine: object) -> list[str]:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["engine"].update(engine)
    return [str(problem) for problem in validate_spec(parse_spec(manifest["spec"]))]


def test_valid_examples_have_no_problems() -> None:
    for name in ("qwen2.5-7b-910b.yaml", "qwen2.5-32b-tp4.yaml", "sandbox-cpu.yaml"):
        assert validate_spec(parse_spec(example(name)["spec"])) == []


def test_extra_args_that_fight_a_field_name_the_field() -> None:
    assert spec_with(extraArgs=["--enable-prefix-caching", "--tensor-parallel-size", "2"]) == [
        "spec.engine.extraArgs[1]: --tensor-parallel-size is set from spec.parallelism.tensor; set it there instead"
    ]
    assert "spec.engine.extraArgs[0]" in spec_with(extraArgs=["--compilation-config={}"])[0]


def test_device_plugin_variables_are_refused() -> None:
    assert spec_with(env=[{"name": "ASCEND_VISIBLE_DEVICES", "value": "0"}]) == [
        "spec.engine.env[0]: ASCEND_VISIBLE_DEVICES is set by the NPU device plugin for the NPUs it allocates"
    ]


def test_paths_with_dotdot_are_refused() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["model"]["path"] = "/models/../etc"
    problems = validate_spec(parse_spec(manifest["spec"]))
    assert [p.field for p in problems] == ["spec.model.path"]
