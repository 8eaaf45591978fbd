"""`npu-operator render` as a user runs it: files, directories, stdin, settings, stdout and exit codes."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from npu_operator import cli
from npu_runtime.files import MAX_TEXT_BYTES

from tests.examples import EXAMPLES
from tests.operator.conftest import Render


def render(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **{f"NPU_OPERATOR_{key.upper()}": value for key, value in settings.items()}}
    return subprocess.run(
        [sys.executable, "-m", "npu_operator.cli", "render", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_render_refuses_a_priority_class_the_operator_does_not_allow() -> None:
    result = render("-f", str(EXAMPLES / "qwen2.5-32b-tp4.yaml"))
    assert result.returncode == 2
    assert "spec.template.priorityClassName: 'inference-high' is not an allowed priority class" in result.stderr


def test_render_prints_valid_children_that_request_npus() -> None:
    # The example's priority class, allowed as its comment says (the chart's allowedPriorityClasses).
    result = render("-f", str(EXAMPLES / "qwen2.5-32b-tp4.yaml"), allowed_priority_classes="inference-high")
    assert result.returncode == 0, result.stderr
    children = list(yaml.safe_load_all(result.stdout))
    assert [c["kind"] for c in children] == ["Deployment", "Service"]
    for child in children:
        kubernetes_validate.validate(child, "1.37.0", strict=True)
    limits = children[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["huawei.com/Ascend910"] == 4


def test_render_prints_the_disaggregated_set_with_both_roles_arguments() -> None:
    result = render("-f", str(EXAMPLES / "deepseek-r1-w8a8-pd.yaml"))
    assert result.returncode == 0, result.stderr
    children = list(yaml.safe_load_all(result.stdout))
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("Deployment", "deepseek-r1-pd"),
        ("DisaggregatedSet", "deepseek-r1-pd"),
        ("Service", "deepseek-r1-pd"),
        ("Service", "deepseek-r1-pd-prefill"),
        ("Service", "deepseek-r1-pd-decode"),
    ]
    for role in children[1]["spec"]["roles"]:
        args = role["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
        kv_role = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_role"]
        assert (args[:2], kv_role) == (
            ["npu-runtime", "serve"],
            {"prefill": "kv_producer", "decode": "kv_consumer"}[role["name"]],
        )
    assert children[0]["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["npu-runtime", "route"]


def test_render_json() -> None:
    result = render("-f", str(EXAMPLES / "qwen2.5-7b-910b.yaml"), "-o", "json", "--pod-monitor-api")
    assert result.returncode == 0, result.stderr
    assert [c["kind"] for c in json.loads(result.stdout)] == [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "PodMonitor",
    ]


def test_render_refuses_an_invalid_manifest_naming_the_field(tmp_path: Path) -> None:
    manifest = yaml.safe_load((EXAMPLES / "sandbox-cpu.yaml").read_text())
    manifest["spec"]["parallelism"] = {"tensor": 2}
    second = yaml.safe_load((EXAMPLES / "sandbox-cpu.yaml").read_text())
    second["metadata"]["name"] = "other"
    second["spec"]["npu"] = {"count": 1, "resourceName": "kubernetes.io/npu"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all([manifest, second]))
    result = render("-f", str(path))
    assert result.returncode == 2
    assert "spec.parallelism: parallelism.tensor x pipeline x data (2) must equal npu.count (0)" in result.stderr
    assert "spec.npu.resourceName" in result.stderr
    assert result.stdout.strip() == ""


def test_a_bad_operator_setting_exits_with_its_name(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npu_operator.cli", "render", "-f", str(EXAMPLES / "sandbox-cpu.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NPU_OPERATOR_RESYNC_SECONDS": "-1", "PATH": "/usr/bin"},
    )
    assert result.returncode == 2
    assert "NPU_OPERATOR_RESYNC_SECONDS" in result.stderr


GOOD = (EXAMPLES / "sandbox-cpu.yaml").read_text(encoding="utf-8")
HEAD = "apiVersion: inference.npu.dev/v1alpha1\nkind: NPUInference\n"
# Document shapes that printed a traceback; each must be an error line naming the file, exit 2.
MALFORMED = {
    "scalar": "42\n",
    "string": "just text\n",
    "list": "- a\n- b\n",
    "metadata-null": GOOD.replace("metadata:", "metadata: null\nx_old_metadata:", 1),
    "metadata-list": HEAD + "metadata: []\nspec: {}\n",
    "metadata-name-list": HEAD + "metadata: {name: [1]}\nspec: {}\n",
    "spec-null": HEAD + "metadata: {name: x}\nspec: null\n",
    "spec-list": HEAD + "metadata: {name: x}\nspec: [1, 2]\n",
    "env-item-string": GOOD.replace("- name: VLLM_CPU_KVCACHE_SPACE", "- FOO=bar\n      - name: X", 1),
    "extra-args-not-strings": GOOD.replace("engine:", "engine:\n    extraArgs: [{a: 1}, 3]", 1),
    "bad-yaml": "a: [\n",
    "no-metadata": HEAD + GOOD[GOOD.index("spec:") :],
    "metadata-no-name": HEAD + "metadata: {}\n" + GOOD[GOOD.index("spec:") :],
    "metadata-name-not-string": HEAD + "metadata: {name: [1], namespace: 5}\n" + GOOD[GOOD.index("spec:") :],
}


def test_every_malformed_document_is_an_error_line(tmp_path: Path) -> None:
    documents = {label: text for label, text in MALFORMED.items() if label != "bad-yaml"}
    path = tmp_path / "malformed.yaml"
    path.write_text("---\n".join(documents.values()), encoding="utf-8")
    result = render("-f", str(path))
    assert "Traceback" not in result.stderr and result.returncode == 2, result.stderr
    for index, label in enumerate(documents):
        assert f"{path}[{index}]" in result.stderr, (label, result.stderr)
    broken = tmp_path / "bad.yaml"
    broken.write_text(MALFORMED["bad-yaml"], encoding="utf-8")
    result = render("-f", str(broken))
    assert (result.returncode, "Traceback" in result.stderr) == (2, False) and f"{broken}: not YAML" in result.stderr


def test_binary_and_special_files_are_refused_naming_the_path(tmp_path: Path) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path, why in ((binary, "not UTF-8"), (fifo, "is a FIFO"), (Path("/dev/zero"), "is a character device")):
        result = render("-f", str(path))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"{path}: {why}" in result.stderr


# --- inputs as kubectl reads them: -f -, -f DIR, -R, several -f -------------------------------------

ROOT = EXAMPLES.parent
QWEN = EXAMPLES / "qwen2.5-7b-910b.yaml"
DEEPSEEK = EXAMPLES / "deepseek-r1-w8a8-2node.yaml"


def kinds_and_names(stdout: str) -> list[tuple[str, str]]:
    return [(c["kind"], c["metadata"]["name"]) for c in yaml.safe_load_all(stdout) if c]


def test_dash_reads_standard_input_as_the_file_would_be_read(render_here: Render) -> None:
    from_file = render_here("-f", str(QWEN))
    for name in ("-", "/dev/stdin"):
        piped = subprocess.run(
            [sys.executable, "-m", "npu_operator.cli", "render", "-f", name],
            input=QWEN.read_text(encoding="utf-8"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (piped.returncode, piped.stdout) == (0, from_file.stdout), piped.stderr


def piped(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """`text` as this process's standard input."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_standard_input_is_read_once_and_named_in_errors(render_here: Render, monkeypatch: pytest.MonkeyPatch) -> None:
    twice = render_here("-f", "-", "-f", "/dev/stdin")
    assert twice.returncode == 2 and "<stdin>: named more than once" in twice.stderr
    piped(monkeypatch, "spec: [\n")
    bad = render_here("-f", "-")
    assert bad.returncode == 2 and "<stdin>: not YAML" in bad.stderr


def test_an_endless_standard_input_is_refused_at_the_file_limit() -> None:
    with open("/dev/zero", "rb") as zeros:
        result = subprocess.run(
            [sys.executable, "-m", "npu_operator.cli", "render", "-f", "-"],
            stdin=zeros,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"<stdin>: larger than {MAX_TEXT_BYTES} bytes" in result.stderr


def test_standard_input_over_the_limit_or_not_utf8_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 100)
    for data, why in ((b"#" * 101, "larger than 100 bytes"), (b"\xff\xfe", "not UTF-8 text (byte 0)")):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))  # bytes, not text
        assert cli.main(["render", "-f", "-"]) == 2
        assert f"<stdin>: {why}" in capsys.readouterr().err


def test_a_directory_is_read_like_kubectl_reads_it(tmp_path: Path, render_here: Render) -> None:
    (tmp_path / "b.yaml").write_text(QWEN.read_text(encoding="utf-8"))
    (tmp_path / "a.json").write_text(json.dumps(yaml.safe_load(DEEPSEEK.read_text(encoding="utf-8"))))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "c.yml").write_text(
        (EXAMPLES / "deepseek-r1-w8a8-pd.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    flat = render_here("-f", str(tmp_path))
    assert flat.returncode == 0, flat.stderr
    assert [name for _kind, name in kinds_and_names(flat.stdout)] == ["deepseek-r1"] * 2 + ["qwen25-7b"] * 3
    deep = render_here("-f", str(tmp_path), "-R")
    assert deep.returncode == 0, deep.stderr
    # a.json, b.yaml, then more/c.yml: by name, as kubectl walks it
    assert kinds_and_names(deep.stdout) == kinds_and_names(flat.stdout) + kinds_and_names(
        render_here("-f", str(tmp_path / "more" / "c.yml")).stdout
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    result = render_here("-f", str(empty))
    assert result.returncode == 2 and f"{empty}: no .yaml, .yml, .json file in it" in result.stderr


def test_several_files_render_in_the_order_given(render_here: Render) -> None:
    result = render_here("-f", str(QWEN), "-f", str(DEEPSEEK))
    assert result.returncode == 0, result.stderr
    names = [name for _kind, name in kinds_and_names(result.stdout)]
    assert names == ["qwen25-7b"] * 3 + ["deepseek-r1"] * 2


def test_a_list_from_kubectl_get_renders_each_item_with_its_uid(
    render_here: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = yaml.safe_load(QWEN.read_text(encoding="utf-8"))
    item["metadata"].update(uid="6f1c", resourceVersion="42", generation=3)
    item["status"] = {"phase": "Ready"}
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": [item]}
    piped(monkeypatch, yaml.safe_dump(listed))
    result = render_here("-f", "-")
    assert result.returncode == 0, result.stderr
    children = [c for c in yaml.safe_load_all(result.stdout) if c]
    assert {c["metadata"]["ownerReferences"][0]["uid"] for c in children} == {"6f1c"}


# --- the operator's settings: --config and --set ---------------------------------------------------


def test_config_and_set_give_render_the_policy_a_cluster_has(tmp_path: Path, render_here: Render) -> None:
    sandbox = str(EXAMPLES / "sandbox-cpu.yaml")
    settings = tmp_path / "settings.yaml"
    settings.write_text("allowedHostPaths: [/tmp/npu-sandbox/models]\n", encoding="utf-8")
    assert render_here("-f", sandbox, "--config", str(settings)).returncode == 0
    assert (
        render_here("-f", sandbox, "--set", "operator.podTemplatePolicy.allowedHostPaths=/tmp/npu-sandbox").returncode
        == 0
    )
    assert render_here("-f", sandbox, "--set", "allowedHostPaths={/data,/tmp/npu-sandbox/models}").returncode == 0
    unknown = render_here("-f", sandbox, "--set", "allowedHostPath=/tmp")
    assert unknown.returncode == 2 and "--set allowedHostPath: no such setting" in unknown.stderr
    missing = render_here("-f", sandbox, "--config", str(tmp_path / "none.yaml"))
    assert missing.returncode == 2 and "none.yaml: cannot read: file not found" in missing.stderr


# --- what optional APIs leave out ------------------------------------------------------------------


def test_children_left_out_for_their_apis_are_named_in_a_last_comment_line(render_here: Render) -> None:
    result = render_here("-f", str(QWEN))
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    assert last == (
        "# not rendered, their APIs not assumed served (--all-apis renders every one):"
        " PodMonitor/qwen25-7b (--pod-monitor-api); ScaledObject/qwen25-7b (--keda-api);"
        " ServiceAccount/qwen25-7b-epp, Role/qwen25-7b-epp, RoleBinding/qwen25-7b-epp, ConfigMap/qwen25-7b-epp,"
        " Deployment/qwen25-7b-epp, Service/qwen25-7b-epp, InferencePool/qwen25-7b (--inference-pool-api);"
        " PodMonitor/qwen25-7b-epp (--pod-monitor-api --inference-pool-api);"
        " DestinationRule/qwen25-7b-epp (--istio-api)"
    )
    every = render_here("-f", str(QWEN), "--all-apis")
    assert not any(line.startswith("#") for line in every.stdout.splitlines())
    # Each group is what its flags add (the picker's PodMonitor needs two APIs).
    groups = re.findall(r"([^:;]+) \(((?:--[a-z-]+ ?)+)\)", last)
    listed = {flags: set(names.split(", ")) for names, flags in groups}
    assert {flag for flags in listed for flag in flags.split()} == {api.flag for api in cli.OPTIONAL_APIS}
    rendered = {f"{kind}/{name}" for kind, name in kinds_and_names(result.stdout)}

    def added(*flags: str) -> set[str]:
        out = render_here("-f", str(QWEN), *flags).stdout
        return {f"{kind}/{name}" for kind, name in kinds_and_names(out)} - rendered

    for flags, names in listed.items():
        each = flags.split()
        # A child that needs two APIs is what their flags add together, beyond what each adds alone.
        alone = set().union(*(added(flag) for flag in each)) if len(each) > 1 else set()
        assert added(*each) - alone == {name.strip() for name in names}


def test_json_output_names_what_was_left_out_on_stderr(render_here: Render) -> None:
    result = render_here("-f", str(QWEN), "-o", "json")
    assert result.returncode == 0 and json.loads(result.stdout)
    assert "# not rendered, their APIs not assumed served" in result.stderr


def test_a_resource_without_optional_children_gets_no_comment(render_here: Render) -> None:
    result = render_here("-f", str(EXAMPLES / "qwen2.5-7b-modelscope.yaml"))
    assert result.returncode == 0 and "#" not in result.stdout


# --- the commands the examples and the documents print ----------------------------------------------


def example_command(path: Path) -> list[str]:
    """The `npu-operator render ...` command in an example's first comment line, as argv."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("#") and "npu-operator render " in first, f"{path.name}: first line {first!r}"
    return shlex.split(first[first.index("npu-operator render ") :])


@pytest.mark.parametrize("name", sorted(path.name for path in EXAMPLES.glob("*.yaml")))
def test_every_example_renders_with_the_command_its_first_line_gives(
    name: str, no_settings: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    argv = example_command(EXAMPLES / name)
    assert argv[:2] == ["npu-operator", "render"] and f"examples/{name}" in argv
    assert cli.main(argv[1:]) == 0, capsys.readouterr().err
    if "--set" not in argv:  # it says so when it needs a setting: without one it renders as it is
        return
    args = argv[1:]
    without = [arg for index, arg in enumerate(args) if "--set" not in (arg, args[index - 1] if index else "")]
    assert cli.main(without) == 2


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
INLINE = re.compile(r"`([^`]*npu-operator render [^`]*)`")
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def documented_commands() -> list[tuple[str, str]]:
    """Every `npu-operator render` command in README and docs/, inline or a line of a code block
    (a shell prompt's `$ ` dropped), but those that need a cluster (kubectl, helm)."""
    found: list[tuple[str, str]] = []
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        lines = [line for block in FENCE.findall(text) for line in block.splitlines()]
        inline = [" ".join(span.split()) for span in INLINE.findall(FENCE.sub("", text))]
        for command in [*inline, *(line.removeprefix("$ ") for line in lines if "npu-operator render " in line)]:
            if not re.search(r"\b(kubectl|helm)\b", command) and not command.startswith("#"):
                found.append((path.name, command))
    return found


def test_the_documents_show_render_reading_a_pipeline() -> None:
    assert any(
        re.search(r"\| (\.venv/bin/)?npu-operator render -f -", command) for _doc, command in documented_commands()
    )


@pytest.mark.parametrize(("document", "command"), documented_commands())
def test_every_documented_render_command_works_as_printed(
    document: str,
    command: str,
    no_settings: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(ROOT)
    words = shlex.split(command, comments=True)
    if "|" in words:  # `cat FILE... | npu-operator render -f -`: the files become standard input
        source, words = words[: words.index("|")], words[words.index("|") + 1 :]
        assert source[0] == "cat", f"{document}: {command}"
        piped = b"".join(Path(name).read_bytes() for name in source[1:])
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(piped)))
    assert words[0] in ("npu-operator", ".venv/bin/npu-operator") and words[1] == "render", command
    expected = 2 if command == "npu-operator render -f examples/sandbox-cpu.yaml" else 0  # README's refusal
    assert cli.main(words[1:]) == expected, f"{document}: {command}\n{capsys.readouterr().err}"
    assert expected or list(yaml.safe_load_all(capsys.readouterr().out)), f"{document}: {command} printed nothing"
