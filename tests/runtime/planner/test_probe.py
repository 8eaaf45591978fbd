"""Device probe: npu-smi parsing, overrides, families, and a probe that works without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import probe
from npu_runtime.planner.probe import (
    DeviceError,
    DeviceInfo,
    _probe_npu_smi,
    _probe_torch_cuda,
    _probe_torch_npu,
    device_family,
    device_from_options,
    device_nodes_present,
    parse_npu_smi,
    probe_device,
)

MIB = 1 << 20

# The layout of `npu-smi info` on an 8 x 910B3 node (two rows per chip; values made up here).
NPU_SMI_910B3 = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc1                 Version: 24.1.rc1                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 95.1        40                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3318 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 93.0        38                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          59351/ 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 1       0                 | 1712733       | python3                  | 56000                   |
+===========================+===============+====================================================+
"""


def test_parse_npu_smi() -> None:
    device = parse_npu_smi(NPU_SMI_910B3)
    assert device == DeviceInfo(
        kind="npu",
        name="Ascend910B3",
        count=2,
        total_bytes=65536 * MIB,
        free_bytes=(65536 - 59351) * MIB,  # the fullest chip
        source="npu-smi",
    )


def test_parse_npu_smi_without_chips() -> None:
    assert parse_npu_smi("npu-smi: command failed\n") is None


def test_npu_smi_failure_is_not_a_device() -> None:
    def fail(argv: list[str]) -> str:
        raise subprocess.CalledProcessError(1, argv)

    assert _probe_npu_smi(run=fail) is None
    assert _probe_npu_smi(run=lambda argv: NPU_SMI_910B3) == parse_npu_smi(NPU_SMI_910B3)


def test_kind_and_memory_given_skip_the_probe() -> None:
    options = PlanOptions(device_kind="npu", device_memory=64 << 30, tensor_parallel=4)
    assert device_from_options(options) == DeviceInfo("npu", "unknown", 4, 64 << 30, None, "override")


def test_partial_overrides_apply_on_top_of_the_probe() -> None:
    device = device_from_options(PlanOptions(device_count=3))
    assert device.count == 3
    assert device.source.endswith("+override")


def test_probe_without_torch_finds_the_cpu() -> None:
    # This environment has neither torch nor npu-smi: the probe must still answer.
    code = "from npu_runtime.planner.probe import probe_device; d = probe_device(); print(d.kind, d.total_bytes > 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[1] == "True"


@pytest.mark.parametrize(
    ("kind", "name", "family"),
    [
        ("npu", "Ascend910B3", "A2"),
        ("npu", "Ascend910B4", "A2"),
        ("npu", "Ascend910_9392", "A3"),
        ("npu", "Ascend310P3", "310P"),
        ("npu", "Ascend950PR", "A5"),
        ("npu", "unknown", "unknown"),
        ("cuda", "NVIDIA H200", "hopper"),
        ("cuda", "NVIDIA A100-SXM4-80GB", "ampere-ada"),
        ("cuda", "NVIDIA B200", "blackwell"),
        ("cuda", "Some GPU", "unknown"),
        ("cpu", "cpu", "cpu"),
    ],
)
def test_device_family(kind: str, name: str, family: str) -> None:
    assert device_family(DeviceInfo(kind, name, 1, 1, None, "override")) == family


@pytest.fixture
def device_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /dev with the nodes of a node with GPUs and NPUs, so that the stand-in torch is asked."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("null", "nvidiactl", "nvidia0", "davinci0", "davinci_manager"):
        (dev / name).touch()
    monkeypatch.setattr(probe, "DEVICE_DIR", str(dev))
    return dev


@pytest.mark.parametrize(
    ("nodes", "kinds"),
    [
        (["null", "tty", "shm"], set()),  # a CPU node
        (["nvidiactl", "nvidia-uvm", "nvidia0"], {"cuda"}),
        (["dxg"], {"cuda"}),  # WSL2
        (["davinci0", "davinci_manager", "devmm_svm", "hisi_hdc"], {"npu"}),
        (["davinci_manager"], {"npu"}),
        (["nvidia-caps"], set()),  # the MIG capability directory alone gives no device
    ],
)
def test_device_nodes_say_which_kinds_torch_could_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: list[str], kinds: set[str]
) -> None:
    for name in nodes:
        (tmp_path / name).touch()
    monkeypatch.setattr(probe, "DEVICE_DIR", str(tmp_path))
    assert {kind for kind in ("npu", "cuda") if device_nodes_present(kind)} == kinds
    monkeypatch.setattr(probe, "DEVICE_DIR", str(tmp_path / "unreadable"))
    assert device_nodes_present("cuda") and device_nodes_present("npu")  # cannot tell: torch is asked


def test_the_probe_without_a_child_interpreter_finds_what_the_child_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    # This machine's real torch (when installed) and real /dev: the probe that asks torch in a child
    # interpreter whatever /dev shows (as before) and the one that skips it without device nodes
    # give the same device. The host's free memory changes from one read to the next: read once.
    host = probe._probe_cpu()
    monkeypatch.setattr(probe, "_probe_cpu", lambda: host)
    with monkeypatch.context() as always_ask:
        always_ask.setattr(probe, "device_nodes_present", lambda kind: True)
        asked = probe_device()
    children: list[object] = []
    real_run = subprocess.run

    def run(*args: object, **kwargs: object) -> object:
        children.append(args)
        return real_run(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "run", run)
    assert probe_device() == asked
    if not device_nodes_present("cuda") and not device_nodes_present("npu"):
        assert asked == host and children == []  # a CPU machine: no child interpreter at all


FAKE_TORCH = """
class _Backend:
    def is_available(self): return True
    def device_count(self): return 2
    def mem_get_info(self, index): return ((40 - index) << 30, 64 << 30)
    def get_device_name(self, index): return {name!r}
{attribute} = _Backend()
"""


@pytest.mark.usefixtures("device_nodes")
def test_torch_probes_run_in_a_child_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in torch (and torch_npu, which registers torch.npu) that only the child process imports.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH.format(name="NVIDIA H200", attribute="cuda"))
    (tmp_path / "torch_npu.py").write_text(
        "import torch\n" + FAKE_TORCH.format(name="Ascend910B3", attribute="torch.npu")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert _probe_torch_cuda() == DeviceInfo("cuda", "NVIDIA H200", 2, 64 << 30, 39 << 30, "torch.cuda")
    assert _probe_torch_npu() == DeviceInfo("npu", "Ascend910B3", 2, 64 << 30, 39 << 30, "torch_npu")
    assert probe_device().source == "torch_npu"
    # The stand-in was never imported here (another test may have imported the real torch).
    for name in ("torch", "torch_npu"):
        assert not str(getattr(sys.modules.get(name), "__file__", "") or "").startswith(str(tmp_path))


@pytest.mark.usefixtures("device_nodes")
def test_a_broken_torch_is_no_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('libcuda.so missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert _probe_torch_cuda() is None


@pytest.mark.usefixtures("device_nodes")
def test_a_given_kind_asks_only_its_own_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in torch with a GPU that leaves a mark whenever a child interpreter imports it.
    marks = tmp_path / "torch-imported"
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"open({str(marks)!r}, 'a').write('x')\n" + FAKE_TORCH.format(name="NVIDIA H200", attribute="cuda")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cpu = device_from_options(PlanOptions(device_kind="cpu", device_count=2))
    assert (cpu.kind, cpu.source, cpu.count) == ("cpu", "cpu+override", 2)  # the GPU is not asked, nor in the way
    assert not marks.exists()
    assert device_from_options(PlanOptions(device_kind="cuda")).source == "torch.cuda"
    assert marks.read_text() == "x"


def test_without_device_nodes_torch_is_not_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in torch that would report a GPU, in an image run on a node that has none.
    marks = tmp_path / "torch-imported"
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        f"open({str(marks)!r}, 'a').write('x')\n" + FAKE_TORCH.format(name="NVIDIA H200", attribute="cuda")
    )
    (tmp_path / "dev").mkdir()
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(probe, "DEVICE_DIR", str(tmp_path / "dev"))
    assert probe_device().source == "cpu"
    assert not marks.exists()


def test_a_kind_this_machine_lacks_needs_its_memory() -> None:
    probed = probe_device()
    other = next(kind for kind in ("npu", "cuda", "cpu") if kind != probed.kind)
    with pytest.raises(DeviceError) as caught:
        device_from_options(PlanOptions(device_kind=other))
    assert caught.value.field == "device_memory"
    assert isinstance(caught.value, PlanError)  # one error type for invalid input: plan and serve exit 2
