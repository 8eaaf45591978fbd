"""`npu-runtime fetch --adapters FILE`: the LoRA adapter list's hub adapters into its cache, against the local hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npu_runtime.adapters import AdapterSource
from npu_runtime.fetch import adapters as fetch_adapters
from npu_runtime.fetch import download as fetch
from npu_runtime.serving import lora
from npu_sandbox.fixtures.local_hub import LocalHub, Repo

from tests.runtime.conftest import HUBS

ADAPTER_REPO = "org/tiny-lora"
pytestmark = pytest.mark.usefixtures("quiet_hub_clients")


@pytest.fixture
def lora_hub(tmp_path: Path) -> LocalHub:
    directory = tmp_path / "lora-files"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["q"]}))
    (directory / "adapter_model.safetensors").write_bytes(b"\x01" * 4096)
    return LocalHub([Repo.from_directory(ADAPTER_REPO, directory)])


def write_list(path: Path, hub: LocalHub, which: str, cache: Path, *extra: dict[str, str]) -> Path:
    entries = [{"name": "a1", "hub": which, "repository": ADAPTER_REPO, "endpoint": hub.url}, *extra]
    path.write_text(json.dumps({"base_model": "tiny", "cache": str(cache), "adapters": entries}))
    return path


@pytest.mark.parametrize("which", HUBS)
def test_only_the_adapters_are_fetched_and_reported(which: str, lora_hub: LocalHub, tmp_path: Path) -> None:
    cache, termination = tmp_path / "cache", tmp_path / "termination"
    missing = {"name": "gone", "hub": which, "repository": "org/missing", "endpoint": lora_hub.url}
    local = {"name": "local", "path": "/var/run/npu-lora-volumes/0/local"}
    listed = write_list(tmp_path / "adapters.json", lora_hub, which, cache, missing, local)
    with lora_hub:
        code = fetch.fetch_command(["--adapters", str(listed), "--termination-message-path", str(termination)])
    assert code == 0  # an adapter that fails does not stop the pod: serve reports it
    reason, _, body = termination.read_text().partition(": ")
    assert reason == "AdaptersReady"
    first, second = json.loads(body)["adapters"]
    assert (first["repository"], first["phase"], first["filesDone"]) == (ADAPTER_REPO, "Ready", 2)
    assert (second["repository"], second["phase"], second["reason"]) == ("org/missing", "Failed", "ModelNotFound")
    snapshots = list(cache.glob(f"{which}/**/snapshots/*/adapter_config.json"))
    assert len(snapshots) == 1
    assert lora_hub.served[f"{ADAPTER_REPO}/adapter_model.safetensors"] == 1


def test_serve_resolves_a_hub_adapter_to_its_checked_snapshot(lora_hub: LocalHub, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = AdapterSource("a1", hub="huggingface", repository=ADAPTER_REPO, endpoint=lora_hub.url)
    with lora_hub:
        path = fetch_adapters.fetch_adapter(source, str(cache))
        again = fetch_adapters.fetch_adapter(source, str(cache))
        missing = AdapterSource("x", hub="huggingface", repository="org/missing", endpoint=lora_hub.url)
        with pytest.raises(lora.AdapterError) as caught:
            fetch_adapters.fetch_adapter(missing, str(cache))
    assert path == again and Path(path, "adapter_model.safetensors").read_bytes() == b"\x01" * 4096
    lora.check_adapter(path, 8)
    assert lora_hub.served[f"{ADAPTER_REPO}/adapter_model.safetensors"] == 1  # the second found it complete
    assert caught.value.reason == lora.ADAPTER_FETCH_FAILED
    assert caught.value.message.startswith("ModelNotFound: huggingface org/missing@main")


def test_a_bad_list_or_no_source_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    termination = tmp_path / "termination"
    bad = tmp_path / "adapters.json"
    bad.write_text(json.dumps({"base_model": "tiny", "adapters": [{"name": "a", "hub": "huggingface"}]}))
    code = fetch.fetch_command(["--adapters", str(bad), "--termination-message-path", str(termination)])
    assert code == 2
    assert termination.read_text().strip() == (
        "InvalidConfiguration: --adapters: adapters[0].repository: is required with a hub"
    )
    with pytest.raises(SystemExit) as exited:
        fetch.fetch_command(["--cache", str(tmp_path)])
    assert exited.value.code == 2
    assert (
        "--hub and --repo (a model), --adapters (a LoRA adapter list), or both are required" in capsys.readouterr().err
    )
