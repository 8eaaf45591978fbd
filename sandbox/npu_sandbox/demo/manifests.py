"""What the demo applies: an example NPUInference pointed at a model on this machine, or at a local hub.

`prepare_model` finds or generates the model (`npu_sandbox.fixtures.tiny_model`); `sandbox_manifest`
mounts its directory as a hostPath; `hub_manifest` has the pod's init container download it from
the local hub (`npu_sandbox.fixtures.local_hub`) into a cache claim.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import yaml

from npu_sandbox.demo.console import SandboxFailed, say
from npu_sandbox.demo.repository import EXAMPLES

DEFAULT_MANIFEST: Final = EXAMPLES / "sandbox-cpu.yaml"
HUB_REPOSITORY: Final = "sandbox/tiny-llama"
HUB_FIELDS: Final = {"hf": "huggingFace", "ms": "modelScope"}


def example_path(text: str) -> Path:
    """A path as given, or a file of the repository's examples/ named by its file name."""
    path = Path(text)
    return path if path.exists() or path.parent != Path(".") else EXAMPLES / text


def prepare_model(model: Path | None, workdir: Path) -> Path:
    if model is not None:
        if not (model / "config.json").is_file():
            raise SandboxFailed(f"--model {model}: no config.json there")
        return model.resolve()
    tiny = workdir / "models" / "tiny-llama"
    if not (tiny / "config.json").is_file():
        say(f"generating the tiny model into {tiny} (seeded, no download)")
        if (
            subprocess.run([sys.executable, "-m", "npu_sandbox.fixtures.tiny_model", str(tiny)], check=False).returncode
            != 0
        ):
            raise SandboxFailed("could not generate the tiny model (is the sandbox extra installed?)")
    return tiny


def sandbox_manifest(path: Path, model: Path) -> dict[str, Any]:
    """The example, pointed at the model directory on this machine (a hostPath volume)."""
    if not path.is_file():
        raise SandboxFailed(f"{path}: not found (run from a clone of the repository, or pass --manifest)")
    manifest: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    manifest["metadata"].setdefault("namespace", "default")
    spec_model = manifest["spec"]["model"]
    spec_model.update(path=str(model), mountPath=str(model.parent), source={"hostPath": {"path": str(model.parent)}})
    if model.name != "tiny-llama":
        spec_model["name"] = model.name
    connector = manifest["spec"].get("disaggregation", {}).get("connector", {})
    if "shared_storage_path" in connector.get("extraConfig", {}):  # the KV files, under the workdir
        connector["extraConfig"]["shared_storage_path"] = str(model.parent.parent / "kv")
    return manifest


def hub_manifest(path: Path, model: Path, source: str, endpoint: str) -> dict[str, Any]:
    """The example, its model taken from the local hub's repository into a cache claim the operator creates."""
    manifest = sandbox_manifest(path, model)
    spec_model = manifest["spec"]["model"]
    for key in ("path", "mountPath"):
        spec_model.pop(key, None)
    spec_model["source"] = {HUB_FIELDS[source]: {"repository": HUB_REPOSITORY, "endpoint": endpoint}}
    spec_model["cache"] = {"claimName": "model-cache", "create": {"size": "10Gi"}}
    return manifest
