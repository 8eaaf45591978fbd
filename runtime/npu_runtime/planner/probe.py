"""Device probe: which accelerator this pod has, how many, and how much memory each one holds.

Order of attempts: torch_npu (`torch.npu.mem_get_info`, device name), then `npu-smi info`
(parsed), then `torch.cuda`, then the host CPU. torch and torch_npu are only imported in a child
interpreter, so this module imports on a machine without them. Every figure can be
replaced through the `--device-*` options; with a kind given, only that kind's sources are
asked; with a kind and a memory size given, nothing is probed.

The torch probes run in a child interpreter: creating an NPU or CUDA context in the runtime's own
process would keep device memory (and, on NPUs, streams) busy for as long as the runtime supervises
vLLM, and vLLM refuses to start when free memory is below what it requests. That child imports
torch (2-5 s on a CPU machine, more with torch_npu), so it is started only when /dev shows the
device nodes without which torch could find no device of that kind: an image that has torch but
runs on a CPU node (or an NPU node, for torch.cuda) answers at once, with the same result.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from npu_runtime.contract import MIB, PlanError, PlanOptions
from npu_runtime.engines import npu_family

_NPU_SMI_TIMEOUT_S: Final = 10.0
_TORCH_PROBE_TIMEOUT_S: Final = 180.0  # importing torch_npu and initialising CANN can take a while
# Run in a child interpreter; prints one JSON object (or null). {module} is "npu" or "cuda".
_TORCH_PROBE: Final = """
import json, torch
{imports}
backend = torch.{module}
if not backend.is_available() or backend.device_count() < 1:
    print("null")
else:
    count = backend.device_count()
    memory = [backend.mem_get_info(i) for i in range(count)]
    print(json.dumps({{"name": str(backend.get_device_name(0)), "count": count,
                      "total": min(int(t) for _, t in memory), "free": min(int(f) for f, _ in memory)}}))
"""
# `npu-smi info` prints two rows per chip: "| 0     910B3    | OK | ..." then
# "| 0                | 0000:C1:00.0 | 0    0 / 0    3318 / 65536 |" where the last pair is the HBM
# (or, on 310P, the memory) used / total in MB.
_NPU_ROW = re.compile(r"^\|\s*(\d+)\s+([A-Za-z0-9][\w.-]*[A-Za-z][\w.-]*)\s*\|\s*[A-Za-z]+\s*\|")
_CHIP_ROW = re.compile(r"^\|\s*\d+\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|")
_USED_TOTAL = re.compile(r"(\d+)\s*/\s*(\d+)")
# The device nodes a container must have for torch to see a device of the kind (names in /dev).
# CUDA: the driver's control node and one node per GPU, which the NVIDIA container toolkit adds
# for every GPU it hands over (NVIDIA/nvidia-container-toolkit, CDI spec: /dev/nvidiactl,
# /dev/nvidia-uvm, /dev/nvidiaN), or WSL2's /dev/dxg. NPU: /dev/davinciN and /dev/davinci_manager,
# which the Ascend device plugin and Ascend Docker Runtime add (vllm-ascend's quick start,
# docs.vllm.ai/projects/ascend, passes them with `docker run --device`).
DEVICE_DIR = "/dev"  # where the device nodes are looked for (a stand-in in tests)
DEVICE_NODES: Final[dict[str, tuple[str, ...]]] = {
    "npu": ("davinci[0-9]*", "davinci_manager"),
    "cuda": ("nvidiactl", "nvidia[0-9]*", "dxg"),
}

# Usable memory per device as torch_npu reports it (`torch.npu.mem_get_info`), by device family
# and nominal size: what an offline plan for a named device assumes. The in-pod probe stays the
# truth; --device-memory overrides both. Figures as the engine logs them (two decimals, GiB):
# - A3 (Ascend910_93xx, 64 GB per die): 61.27 GiB. vllm-ascend's NPUWorker logs "Free memory on
#   device (60.89/61.27 GiB) on startup" (vllm_ascend/worker/worker.py determine_available_memory);
#   every A3 log quoted in public issues shows the same total.
# - A2 64 GB (Ascend910B1/B2/B3): 60.96 GiB. torch_npu's OOM message "60.96 GiB total capacity" in
#   vllm-ascend issues #1670 (910B), #1127 (910B2, DeepSeek-R1-W8A8) and #6611.
# Devices not listed (910B4 32 GB, 310P, 950) need --device-memory or the probe.
USABLE_MEMORY: Final[tuple[tuple[str, int], ...]] = (
    ("A3", round(61.27 * (1 << 30))),
    ("A2-64GB", round(60.96 * (1 << 30))),
)


@dataclass(frozen=True)
class DeviceInfo:
    """Per-device figures of the accelerator the plan is made for."""

    kind: str
    """"npu", "cuda" or "cpu"."""
    name: str
    """E.g. "Ascend910B3", "NVIDIA H200", "cpu"."""
    count: int
    total_bytes: int
    """Per device (the smallest of the visible devices)."""
    free_bytes: int | None
    """Per device when known (the smallest)."""
    source: str
    """How it was found: "torch_npu", "npu-smi", "torch.cuda", "cpu", "override" (or "<probe>+override")."""


def probe_device() -> DeviceInfo:
    """The first of torch_npu, npu-smi, torch.cuda that finds a device; else the host CPU."""
    for kind in ("npu", "cuda"):
        found = probe_kind(kind)
        if found is not None:
            return found
    return _probe_cpu()


def probe_kind(kind: str) -> DeviceInfo | None:
    """The first of `kind`'s own sources that finds one (npu: torch_npu, then npu-smi; cuda:
    torch.cuda; cpu: the host); None when none does. The other kinds are not asked."""
    for attempt in _SOURCES.get(kind, ()):
        found = attempt()
        if found is not None:
            return found
    return None


class DeviceError(PlanError):
    """The overrides cannot describe a device: `field` names the option to add."""


def device_from_options(options: PlanOptions) -> DeviceInfo:
    """Probe, then apply the --device-* overrides. With a kind and a memory size, do not probe."""
    if options.device_kind is not None and options.device_memory is not None:
        return DeviceInfo(
            kind=options.device_kind,
            name=options.device_name or ("cpu" if options.device_kind == "cpu" else "unknown"),
            count=options.device_count or options.tensor_parallel * options.pipeline_parallel * options.data_parallel,
            total_bytes=options.device_memory,
            free_bytes=None,
            source="override",
        )
    if options.device_kind is None:
        probed = probe_device()
    else:
        # Only the given kind's sources: asking torch.cuda (or waiting for torch_npu) for a kind
        # that was not asked for costs seconds to minutes per plan.
        found = probe_kind(options.device_kind)
        usable = usable_memory(options.device_kind, options.device_name)
        if found is None and usable is not None and options.device_name is not None:
            # Off the device: a named device plans with what torch_npu reports for it.
            return DeviceInfo(
                kind=options.device_kind,
                name=options.device_name,
                count=options.device_count
                or options.tensor_parallel * options.pipeline_parallel * options.data_parallel,
                total_bytes=usable,
                free_bytes=None,
                source="device-table",
            )
        if found is None:
            raise DeviceError(
                "device_memory",
                f"this machine shows no {options.device_kind} device: "
                f"give --device-memory to plan for a {options.device_kind} device",
            )
        probed = found
    changes: dict[str, object] = {}
    if options.device_name is not None:
        changes["name"] = options.device_name
    if options.device_memory is not None:
        changes.update(total_bytes=options.device_memory, free_bytes=None)
    if options.device_count is not None:
        changes["count"] = options.device_count
    if not changes:
        return probed
    return dataclasses.replace(probed, source=f"{probed.source}+override", **changes)  # type: ignore[arg-type]


def usable_memory(kind: str, name: str | None) -> int | None:
    """Bytes torch_npu reports for a named NPU (`USABLE_MEMORY`); None when the name is not known."""
    if kind != "npu" or not name:
        return None
    family = device_family(DeviceInfo(kind, name, 1, 1, None, "name"))
    lowered = name.lower()
    key = "A3" if family == "A3" else "A2-64GB" if family == "A2" and re.search(r"910b[123]", lowered) else None
    return dict(USABLE_MEMORY).get(key) if key else None


# -- the attempts ------------------------------------------------------------------------------------


def device_nodes_present(kind: str) -> bool:
    """Whether `DEVICE_DIR` lists a device node of `kind` (`DEVICE_NODES`); True when it cannot be
    read, so that torch is asked as before wherever the nodes cannot be seen."""
    try:
        names = os.listdir(DEVICE_DIR)
    except OSError:
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in DEVICE_NODES[kind])


def _probe_torch_npu() -> DeviceInfo | None:
    if importlib.util.find_spec("torch_npu") is None or not device_nodes_present("npu"):
        return None
    return _probe_torch("npu", "import torch_npu  # registers torch.npu", source="torch_npu")


def _probe_torch(module: str, imports: str, source: str) -> DeviceInfo | None:
    """Ask torch in a child interpreter; None when it finds nothing or fails in any way."""
    code = _TORCH_PROBE.format(module=module, imports=imports)
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=_TORCH_PROBE_TIMEOUT_S
        )
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    if not isinstance(found, dict):
        return None
    try:
        return DeviceInfo(
            kind=module,
            name=str(found["name"]),
            count=int(found["count"]),
            total_bytes=int(found["total"]),
            free_bytes=int(found["free"]),
            source=source,
        )
    except (KeyError, TypeError, ValueError):
        return None


def _probe_npu_smi(run: Callable[[list[str]], str] | None = None) -> DeviceInfo | None:
    if run is None:
        if shutil.which("npu-smi") is None:
            return None
        run = _run_command
    try:
        text = run(["npu-smi", "info"])
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_npu_smi(text)


def _run_command(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=_NPU_SMI_TIMEOUT_S, check=True).stdout


def parse_npu_smi(text: str) -> DeviceInfo | None:
    """DeviceInfo from the chip table of `npu-smi info`; None when it lists no chip."""
    names: list[str] = []
    memory: list[tuple[int, int]] = []
    pending_name: str | None = None
    for line in text.splitlines():
        row = _NPU_ROW.match(line)
        if row:
            pending_name = row.group(2)
            continue
        if pending_name is not None and _CHIP_ROW.match(line):
            pairs = _USED_TOTAL.findall(line)
            if pairs:
                used, total = (int(x) for x in pairs[-1])
                if total > 0:
                    names.append(pending_name)
                    memory.append((used, total))
            pending_name = None
    if not memory:
        return None
    name = names[0] if names[0].lower().startswith("ascend") else f"Ascend{names[0]}"
    return DeviceInfo(
        kind="npu",
        name=name,
        count=len(memory),
        total_bytes=min(total for _, total in memory) * MIB,
        free_bytes=min(total - used for used, total in memory) * MIB,
        source="npu-smi",
    )


def _probe_torch_cuda() -> DeviceInfo | None:
    if importlib.util.find_spec("torch") is None or not device_nodes_present("cuda"):
        return None
    return _probe_torch("cuda", "", source="torch.cuda")


def _probe_cpu() -> DeviceInfo:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    free: int | None = None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return DeviceInfo(kind="cpu", name="cpu", count=1, total_bytes=total, free_bytes=free, source="cpu")


# Each kind's sources, in the order they are asked.
_SOURCES: Final[dict[str, tuple[Callable[[], DeviceInfo | None], ...]]] = {
    "npu": (_probe_torch_npu, _probe_npu_smi),
    "cuda": (_probe_torch_cuda,),
    "cpu": (_probe_cpu,),
}


def device_family(device: DeviceInfo) -> str:
    """The hardware family the engine's rules depend on, from the device name.

    NPU families: `engines.npu_family`. CUDA families matter for the
    attention backend's graph support (FlashAttention 3 on Hopper, 2 elsewhere).
    """
    name = device.name.lower().replace(" ", "")
    if device.kind == "cpu":
        return "cpu"
    if device.kind == "npu":
        return npu_family(device.name)
    if any(tag in name for tag in ("h100", "h200", "h800", "h20", "gh200")):
        return "hopper"
    if any(tag in name for tag in ("b200", "b300", "gb200", "gb300")):
        return "blackwell"
    if any(tag in name for tag in ("a100", "a800", "a10", "a30", "l40", "l4", "rtx")):
        return "ampere-ada"
    return "unknown"
