"""Flags owned by spec fields are refused in every spelling vLLM's own argument parser accepts.

Each smuggled spelling is first shown to work on vLLM's parser (the installed CPU build's
FlexibleArgumentParser with the OpenAI server's options): it really sets the owned option. Then
the operator must refuse it, naming the field. And no option vLLM has that is not owned is refused.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from npu_operator.api.spec import parse_spec
from npu_operator.api.validation import FLAGS_OWNED_BY_FIELDS, engine_flag, owned_flag, validate_spec

from tests.examples import example

# (extra args, the vLLM option they set, the value it gets)
SMUGGLED = [
    (["--max_num_seqs=999"], "max_num_seqs", 999),
    (["--gpu_memory_utilization=0.99"], "gpu_memory_utilization", 0.99),
    (["--served_model_name=x"], "served_model_name", ["x"]),
    (["--compilation-config.cudagraph_mode=FULL"], "compilation_config", None),
    (["--compilation_config.cudagraph_mode", "FULL"], "compilation_config", None),
    (["-cc.cudagraph_mode=FULL"], "compilation_config", None),
    (["-O0"], "optimization_level", "0"),
    (["-O=0"], "optimization_level", "0"),
    (["-O", "0"], "optimization_level", "0"),
    (["--max-num-se", "7"], "max_num_seqs", 7),  # an abbreviation: argparse's allow_abbrev
    (["-t", "3"], "tensor_parallel_size", 3),
    (["-tp=3"], "tensor_parallel_size", 3),
    (["--tensor_parallel_size", "3"], "tensor_parallel_size", 3),
    (["--enforce_eager"], "enforce_eager", True),
    (["--port=1"], "port", 1),
    (["-qawq"], "quantization", "awq"),  # a one-letter option with its value attached
    (["-qfp8"], "quantization", "fp8"),
]


@pytest.fixture(scope="module")
def vllm_parser() -> argparse.ArgumentParser:
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    return parser


def problems(extra: list[str], **model: str) -> list[str]:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["spec"]["engine"]["extraArgs"] = extra
    manifest["spec"]["model"].update(model)
    return [str(problem) for problem in validate_spec(parse_spec(manifest["spec"]))]


@pytest.mark.parametrize(("extra", "dest", "value"), SMUGGLED, ids=[" ".join(s[0]) for s in SMUGGLED])
def test_a_smuggled_spelling_works_on_vllm_and_is_refused(
    vllm_parser: argparse.ArgumentParser, extra: list[str], dest: str, value: Any
) -> None:
    default = getattr(vllm_parser.parse_args(["--model", "/m"]), dest)
    parsed = getattr(vllm_parser.parse_args(["--model", "/m", *extra]), dest)
    assert parsed != default and (value is None or parsed == value)
    found = problems(extra)
    assert len(found) == 1 and found[0].startswith("spec.engine.extraArgs[0]: ")
    assert "set it there instead" in found[0]


def test_no_vllm_option_that_is_not_owned_is_refused(vllm_parser: argparse.ArgumentParser) -> None:
    options = {option for action in vllm_parser._actions for option in action.option_strings}
    refused = sorted(option for option in options if owned_flag(option) and option not in FLAGS_OWNED_BY_FIELDS)
    assert refused == []
    assert problems(["--enable-prefix-caching", "-dpn", "1", "--kv-cache-dtype=fp8", "--seed", "-1"]) == []
    # -q is vLLM's short form of --quantization, which spec.engine.quantization owns.
    assert problems(["-q", "awq"]) == [
        "spec.engine.extraArgs[0]: -q is set from spec.engine.quantization; set it there instead"
    ]


def test_the_message_names_the_spelling_and_the_field() -> None:
    assert problems(["--max_num_seqs=999"]) == [
        "spec.engine.extraArgs[0]: '--max_num_seqs' is --max-num-seqs: --max-num-seqs is set from "
        "spec.engine.maxNumSeqs; set it there instead"
    ]
    assert engine_flag("--a_b.c_d=e_f") == "--a-b" and engine_flag("-5") is None and engine_flag("x") is None


@pytest.mark.parametrize("name", ["--", "--port=1", "-O0"])
def test_a_model_name_that_reads_as_a_flag_is_refused(name: str) -> None:
    assert problems([], name=name) == [f"spec.model.name: {name!r} would be read as a flag; start it otherwise"]


@pytest.mark.parametrize(
    ("extra", "index"),
    [
        (["/other/model"], 0),  # vLLM takes it as model_tag, a headless worker as --model
        (["--seed", "1", "/other/model"], 2),
        (["--kv-cache-dtype=fp8", "/other/model"], 1),
        (["--", "--port", "1"], 0),  # `--` ends the options: everything after is positional
    ],
)
def test_a_positional_extra_argument_is_refused(extra: list[str], index: int) -> None:
    found = problems(extra)
    assert found and found[0].startswith(f"spec.engine.extraArgs[{index}]: ")
    assert "positional" in found[0]


def test_options_with_their_values_are_no_positional_arguments() -> None:
    assert problems(["--seed", "-1", "--max-log-len", "100", "--enable-prefix-caching", "--x=1"]) == []


@pytest.mark.parametrize("mount", ["/dev/shm", "/dev/shm/", "/etc/npu-runtime/calibration", "/var/run/npu-model"])
def test_a_model_mounted_over_one_of_the_pods_own_mounts_is_an_invalid_spec(mount: str) -> None:
    # Kubernetes refuses a pod template with two volumes at one path: without this check the whole
    # workload write is refused (ChildRejected) instead of the field being named.
    found = problems([], mountPath=mount)
    assert [p.split(":", 1)[0] for p in found] == ["spec.model.mountPath"]
    assert "mount the model elsewhere" in found[0]
