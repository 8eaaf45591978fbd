"""The LoRA adapter list kept in step with an engine (serving/lora.py), against a fake engine over HTTP.

The fake answers vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter as vLLM 0.31 does
(vllm/entrypoints/openai/models/serving.py: 200 with a text, 400 for a name already loaded, 404 for
one not loaded, 500 with an ErrorResponse when the worker refuses it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from npu_runtime import metrics
from npu_runtime.contract import PlanOptions, parse_serve_args
from npu_runtime.serving import lora
from npu_runtime.serving.lora import AdapterState, AdapterSync, EngineAdapters, Limits
from npu_runtime.serving.serve import ServeError, check_lora_options
from npu_runtime.serving.status import RuntimeStatus


class FakeEngine:
    """vLLM's LoRA endpoints: `loaded` name -> path, `refuse` name -> the worker's error, `calls` in order."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}
        self.refuse: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = engine.answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        name = body["lora_name"]
        self.calls.append((path.rsplit("/", 1)[1], name))
        if path == "/v1/load_lora_adapter":
            if name in self.loaded:
                return 400, error(f"The lora adapter '{name}' has already been loaded.", 400)
            if name in self.refuse:
                return 500, error(f"Call to add_lora method failed: {self.refuse[name]}", 500)
            self.loaded[name] = body["lora_path"]
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if name not in self.loaded:
            return 404, error(f"The lora adapter '{name}' cannot be found.", 404)
        del self.loaded[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully."


def error(message: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def adapter(directory: Path, *, rank: int = 8, **config: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["q_proj"], **config}
    (directory / lora.CONFIG_FILE).write_text(json.dumps(body))
    (directory / "adapter_model.safetensors").write_bytes(b"weights")
    return directory


def write_list(path: Path, adapters: dict[str, Path | dict[str, str]], cache: str | None = None) -> None:
    entries = [{"name": n, **(s if isinstance(s, dict) else {"path": str(s)})} for n, s in adapters.items()]
    body: dict[str, Any] = {"base_model": "tiny", "adapters": entries}
    if cache:
        body["cache"] = cache
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)


def sync_for(path: Path, engine: FakeEngine, *, max_adapters: int = 4, **kwargs: Any) -> AdapterSync:
    return AdapterSync(str(path), Limits(8, max_adapters, "--max-cpu-loras"), EngineAdapters([engine.url]), **kwargs)


def states(sync: AdapterSync) -> dict[str, tuple[str, str | None]]:
    return {entry["name"]: (entry["state"], entry["reason"]) for entry in sync.document()}


def test_added_removed_and_changed_adapters_follow_the_file(tmp_path: Path, engine: FakeEngine) -> None:
    a1, a2, a2_new = adapter(tmp_path / "a1"), adapter(tmp_path / "a2"), adapter(tmp_path / "a2-v2")
    listed = tmp_path / "adapters.json"
    write_list(listed, {"a1": a1})
    sync = sync_for(listed, engine)
    assert not sync.settled()
    assert sync.poll()
    assert sync.settled()
    assert engine.loaded == {"a1": str(a1)}
    assert states(sync) == {"a1": ("loaded", None)}
    assert not sync.poll()  # unchanged: nothing asked
    assert len(engine.calls) == 1

    write_list(listed, {"a1": a1, "a2": a2})
    assert sync.poll()
    assert engine.loaded == {"a1": str(a1), "a2": str(a2)}

    write_list(listed, {"a1": a1, "a2": a2_new})  # another source under the same name: unload, load
    assert sync.poll()
    assert engine.calls[-2:] == [("unload_lora_adapter", "a2"), ("load_lora_adapter", "a2")]
    assert engine.loaded["a2"] == str(a2_new)

    write_list(listed, {"a2": a2_new})
    assert sync.poll()
    assert engine.loaded == {"a2": str(a2_new)}
    assert states(sync) == {"a2": ("loaded", None)}
    assert sync.loaded() == {"a2": True}


def test_an_adapter_the_engine_refuses_fails_alone_with_its_message(tmp_path: Path, engine: FakeEngine) -> None:
    engine.refuse["bad"] = "Worker failed with error 'LoRA rank 64 is greater than max_lora_rank 8.'"
    listed = tmp_path / "adapters.json"
    write_list(listed, {"bad": adapter(tmp_path / "bad"), "good": adapter(tmp_path / "good")})
    sync = sync_for(listed, engine)
    sync.poll()
    assert list(engine.loaded) == ["good"]
    bad = next(entry for entry in sync.document() if entry["name"] == "bad")
    assert bad["state"] == "failed" and bad["reason"] == lora.ADAPTER_LOAD_FAILED
    assert "500: Call to add_lora method failed: Worker failed with error 'LoRA rank 64" in bad["message"]
    assert sync.loaded() == {"bad": False, "good": True}


def test_the_checks_refuse_before_the_engine_is_asked(tmp_path: Path, engine: FakeEngine) -> None:
    listed = tmp_path / "adapters.json"
    write_list(
        listed,
        {
            "big": adapter(tmp_path / "big", rank=64),
            "prefix": adapter(tmp_path / "prefix", peft_type="PREFIX_TUNING"),
            "missing": tmp_path / "nowhere",
        },
    )
    sync = sync_for(listed, engine)
    sync.preview()  # before the engine runs: checked, nothing loaded
    assert states(sync) == dict.fromkeys(("big", "prefix", "missing"), ("failed", lora.ADAPTER_INVALID))
    sync.poll()
    assert engine.calls == []
    messages = {entry["name"]: entry["message"] for entry in sync.document()}
    assert messages["big"] == "adapter_config.json r: rank 64 is greater than --max-lora-rank 8"
    assert "peft_type: 'PREFIX_TUNING'" in messages["prefix"]
    assert messages["missing"] == f"{tmp_path / 'nowhere' / 'adapter_config.json'}: no such file"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"r": 0}, "adapter_config.json r: 0 is not a positive rank"),
        ({"r": "8"}, "adapter_config.json r: '8' is not a positive rank"),
        ({"target_modules": []}, "adapter_config.json target_modules: missing or empty"),
        ({"target_modules": None}, "adapter_config.json target_modules: missing or empty"),
    ],
)
def test_config_checks_name_the_field(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    with pytest.raises(lora.AdapterError) as caught:
        lora.check_adapter(str(adapter(tmp_path / "x", **config)), 8)
    assert caught.value.message == message


def test_a_config_without_weights_is_refused(tmp_path: Path) -> None:
    directory = adapter(tmp_path / "x")
    (directory / "adapter_model.safetensors").unlink()
    with pytest.raises(lora.AdapterError, match="no adapter weights"):
        lora.check_adapter(str(directory), 8)
    lora.check_adapter(str(adapter(tmp_path / "ok", rank=8)), 8)  # at the limit is fine


def test_more_adapters_than_max_cpu_loras_are_refused(tmp_path: Path, engine: FakeEngine) -> None:
    listed = tmp_path / "adapters.json"
    write_list(listed, {name: adapter(tmp_path / name) for name in ("a", "b", "c")})
    sync = sync_for(listed, engine, max_adapters=2)
    sync.poll()
    assert sorted(engine.loaded) == ["a", "b"]
    c = next(entry for entry in sync.document() if entry["name"] == "c")
    assert (c["state"], c["reason"], c["message"]) == (
        "failed",
        "TooManyAdapters",
        "more than --max-cpu-loras 2 adapters listed",
    )


def test_a_list_that_cannot_be_read_keeps_the_adapters_loaded(tmp_path: Path, engine: FakeEngine) -> None:
    listed = tmp_path / "adapters.json"
    write_list(listed, {"a1": adapter(tmp_path / "a1")})
    sync = sync_for(listed, engine)
    sync.poll()
    listed.write_text('{"base_model": "tiny", "adapters": [{"name": "x"}]}')
    sync.poll()
    assert "adapters[0]: needs exactly one of path and hub" in str(sync.list_error)
    assert list(engine.loaded) == ["a1"]
    listed.unlink()
    sync.poll()
    assert sync.list_error == f"--lora-adapters {listed}: no such file"
    assert list(engine.loaded) == ["a1"] and states(sync) == {"a1": ("loaded", None)}


def test_an_engine_that_is_gone_fails_the_adapter_not_the_sync(tmp_path: Path, engine: FakeEngine) -> None:
    listed = tmp_path / "adapters.json"
    write_list(listed, {"a1": adapter(tmp_path / "a1")})
    engine.server.shutdown()
    engine.server.server_close()
    sync = sync_for(listed, engine)
    assert sync.poll()
    entry = sync.document()[0]
    assert (entry["state"], entry["reason"]) == ("failed", lora.ADAPTER_LOAD_FAILED)
    assert "Connection refused" in entry["message"] or "URLError" in entry["message"]


def test_a_hub_adapter_is_resolved_by_the_injected_fetch(tmp_path: Path, engine: FakeEngine) -> None:
    listed = tmp_path / "adapters.json"
    hub = {"hub": "huggingface", "repository": "org/a-lora"}
    write_list(listed, {"h": hub}, cache=str(tmp_path / "cache"))
    fetched = adapter(tmp_path / "cache" / "h")
    asked: list[tuple[str | None, str | None]] = []

    def resolve(source: Any, cache: str | None) -> str:
        asked.append((source.repository, cache))
        return str(fetched)

    sync_for(listed, engine, resolve=resolve).poll()
    assert asked == [("org/a-lora", str(tmp_path / "cache"))]
    assert engine.loaded == {"h": str(fetched)}

    without = sync_for(listed, FakeEngine())
    without.poll()
    assert states(without) == {"h": ("failed", lora.ADAPTER_FETCH_FAILED)}


def test_status_and_metrics_show_each_adapter(tmp_path: Path, engine: FakeEngine) -> None:
    engine.refuse["bad"] = "no"
    listed = tmp_path / "adapters.json"
    write_list(listed, {"a1": adapter(tmp_path / "a1"), "bad": adapter(tmp_path / "bad")})
    sync = sync_for(listed, engine)
    status = RuntimeStatus(None, "FULL_DECODE_ONLY")
    status.set_adapters(sync)
    assert not status.adapters_settled()
    sync.poll()
    assert status.adapters_settled()
    document = status.document()
    assert document["adapters"][0] == AdapterState("a1", "loaded").to_dict()
    assert document["adapters"][1]["state"] == "failed"
    assert document["adapter_list_error"] is None
    values = status.metric_values()
    assert values.lora_loaded == {"a1": True, "bad": False}
    families = {family.name: family for family in metrics.families(values)}
    assert [(s.labels, s.value) for s in families["npu_lora_adapter_loaded"].samples] == [
        ({"adapter": "a1"}, 1),
        ({"adapter": "bad"}, 0),
    ]
    assert "adapters" not in RuntimeStatus(None, "FULL_DECODE_ONLY").document()


def test_lora_adapters_need_max_loras() -> None:
    options = parse_serve_args(["--model", "m", "--lora-adapters", "a.json"])
    with pytest.raises(ServeError) as caught:
        check_lora_options(options)
    assert caught.value.exit_code == 2
    assert (
        caught.value.failure.line()
        == "InvalidConfiguration: --lora-adapters: needs --max-loras (LoRA is off without it)"
    )
    check_lora_options(parse_serve_args(["--model", "m", "--lora-adapters", "a.json", "--max-loras", "2"]))
    assert Limits.from_plan(PlanOptions(max_loras=2)) == Limits(16, 2, "--max-cpu-loras (default: --max-loras)")
