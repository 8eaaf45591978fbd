"""LoRA adapters while `npu-runtime serve` runs: the list file (`npu_runtime.adapters`) kept in step with the engine.

- **Checked first** (`check_adapter`): the adapter's `adapter_config.json` (`peft_type` LORA, `r` at most
  the plan's max_lora_rank, `target_modules` present) and its weights file, as vLLM reads them
  (vllm/lora/peft_helper.py `PEFTHelper.from_local_dir`, vllm/lora/lora_model.py
  `LoRAModel.from_local_checkpoint`). A bad adapter is reported (reason AdapterInvalid, the field
  named) and never handed to the engine.
- **Loaded through the engine's API, never as --lora-modules.** vLLM's API server loads its
  --lora-modules in `OpenAIServingModels.init_static_loras` (vllm/entrypoints/openai/models/serving.py)
  and raises on the first one the engine refuses, so one bad adapter would stop the engine at every
  start: a crash loop. Through `/v1/load_lora_adapter` (vllm/entrypoints/serve/lora/api_router.py,
  mounted only with VLLM_ALLOW_RUNTIME_LORA_UPDATING, which serve sets) each adapter fails alone
  with the engine's message, and the others serve. The first sync runs as soon as the engine's
  /health answers; /readyz waits for it, so a pod is ready with its listed adapters loaded.
- **Kept in step** (`AdapterSync.poll`, every SYNC_SECONDS): the file is stat'ed and, when it changed
  (the kubelet swaps a ConfigMap's files in place), read (at most MAX_LIST_BYTES) and compared by
  name and source (`AdapterSource.key`): an added adapter is loaded, a removed one unloaded, one
  whose source changed unloaded then loaded. A list that cannot be read changes nothing (the
  adapters loaded stay) and is reported. A failed adapter is tried again when the list changes; an
  unload the engine refused, at every poll.
- **At most max_cpu_loras adapters** (vLLM's default: max_loras, vllm/config/lora.py
  `LoRAConfig.__post_init__`): the list's first ones; each one beyond is TooManyAdapters.
- **A hub adapter** is downloaded into the list's `cache` by a `Resolve` the command entry injects.
  The import layers put `npu_runtime.fetch` above `npu_runtime.serving` (fetch reports with
  serving's failure reasons), so this module cannot call the fetch; instead
  `npu_runtime.fetch.adapters.serve_command`, the function cli's COMMANDS names for `serve`, hands
  `serve` its `fetch_adapter`. Started without one (`python -m npu_runtime.serving.serve`), a hub
  adapter fails with a message saying so; path adapters work either way.

Nothing here raises into `serve`: every failure becomes an adapter's state (`AdapterState`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from npu_runtime.adapters import AdapterList, AdapterListError, AdapterSource, parse_adapter_list
from npu_runtime.contract import PlanOptions
from npu_runtime.planner.lora import DEFAULT_MAX_LORA_RANK
from npu_runtime.serving.server import post_json

RUNTIME_UPDATING_ENV: Final = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
CONFIG_FILE: Final = "adapter_config.json"
# What vllm/lora/lora_model.py LoRAModel.from_local_checkpoint reads, in its order.
WEIGHT_FILES: Final = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
SYNC_SECONDS: Final = 5.0
MAX_LIST_BYTES: Final = 1 << 20
ENGINE_TIMEOUT_SECONDS: Final = 120.0  # a load reads the adapter's weights in every worker

LOADED: Final = "loaded"
FAILED: Final = "failed"
PENDING: Final = "pending"
# Reasons (CamelCase, as the runtime's failures).
ADAPTER_INVALID: Final = "AdapterInvalid"
ADAPTER_LOAD_FAILED: Final = "AdapterLoadFailed"
ADAPTER_UNLOAD_FAILED: Final = "AdapterUnloadFailed"
ADAPTER_FETCH_FAILED: Final = "AdapterFetchFailed"
TOO_MANY_ADAPTERS: Final = "TooManyAdapters"


class AdapterError(Exception):
    """One adapter cannot be served: the reason and a message naming the field or the engine's words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# (source, the list's cache) -> the adapter's directory in the pod; raises AdapterError.
Resolve = Callable[[AdapterSource, str | None], str]


@dataclasses.dataclass(frozen=True)
class AdapterState:
    """One listed adapter as /status shows it."""

    name: str
    state: str  # loaded, failed, pending
    reason: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "reason": self.reason, "message": self.message}


@dataclasses.dataclass(frozen=True)
class Limits:
    """The plan's LoRA limits: the largest rank, and how many adapters may be listed."""

    max_rank: int
    max_adapters: int
    max_adapters_flag: str  # the flag that set max_adapters, for messages

    @classmethod
    def from_plan(cls, plan: PlanOptions) -> Limits:
        """The limits of a plan with LoRA on (max_loras set: `serve` checks it first)."""
        assert plan.max_loras is not None
        rank = plan.max_lora_rank if plan.max_lora_rank is not None else DEFAULT_MAX_LORA_RANK
        if plan.max_cpu_loras is not None:
            return cls(rank, plan.max_cpu_loras, "--max-cpu-loras")
        return cls(rank, plan.max_loras, "--max-cpu-loras (default: --max-loras)")


def log(message: str) -> None:
    print(f"npu-runtime: lora: {message}", file=sys.stderr, flush=True)


# ----- checks -----


def check_adapter(directory: str, max_rank: int) -> None:
    """AdapterError(AdapterInvalid) unless `directory` holds a LoRA adapter vLLM can load at `max_rank`."""
    config = _adapter_config(Path(directory) / CONFIG_FILE)
    peft_type = config.get("peft_type")
    if str(peft_type).upper() != "LORA":
        raise AdapterError(ADAPTER_INVALID, f"{CONFIG_FILE} peft_type: {peft_type!r}, vLLM serves LORA adapters only")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(ADAPTER_INVALID, f"{CONFIG_FILE} r: {rank!r} is not a positive rank")
    if rank > max_rank:
        raise AdapterError(ADAPTER_INVALID, f"{CONFIG_FILE} r: rank {rank} is greater than --max-lora-rank {max_rank}")
    targets = config.get("target_modules")
    if not targets or not isinstance(targets, str | list):
        raise AdapterError(ADAPTER_INVALID, f"{CONFIG_FILE} target_modules: missing or empty")
    if not any((Path(directory) / name).is_file() for name in WEIGHT_FILES):
        raise AdapterError(ADAPTER_INVALID, f"{directory}: no adapter weights ({', '.join(WEIGHT_FILES)})")


def _adapter_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterError(ADAPTER_INVALID, f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise AdapterError(ADAPTER_INVALID, f"{path}: cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(ADAPTER_INVALID, f"{path}: must be a JSON object")
    return config


# ----- the engine -----


def engine_message(status: int, text: str) -> str:
    """The engine's words from an error answer: vLLM's ErrorResponse `{"error": {"message"}}`, else the body."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        body = json.loads(text)
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return f"{status}: {message}"
    return f"{status}: {text.strip()[:500]}"


class EngineAdapters:
    """vLLM's LoRA endpoints on every API server of this pod (one, or one per rank); none on a headless worker."""

    def __init__(self, base_urls: Sequence[str], timeout: float = ENGINE_TIMEOUT_SECONDS) -> None:
        self.base_urls = list(base_urls)
        self.timeout = timeout

    def load(self, name: str, path: str) -> None:
        for base in self.base_urls:
            status, text = post_json(
                f"{base}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, self.timeout
            )
            if status != 200:
                raise AdapterError(
                    ADAPTER_LOAD_FAILED, f"the engine at {base} refused it: {engine_message(status, text)}"
                )

    def unload(self, name: str) -> None:
        """404 is done: the engine does not have it (any more)."""
        for base in self.base_urls:
            status, text = post_json(f"{base}/v1/unload_lora_adapter", {"lora_name": name}, self.timeout)
            if status not in (200, 404):
                raise AdapterError(
                    ADAPTER_UNLOAD_FAILED, f"the engine at {base} did not unload it: {engine_message(status, text)}"
                )


# ----- the sync -----


@dataclasses.dataclass(frozen=True)
class _Loaded:
    source: AdapterSource
    path: str


class AdapterSync:
    """The list file and the engine's adapters, in step; thread-safe reads for /status and /metrics."""

    def __init__(
        self, list_path: str, limits: Limits, engine: EngineAdapters, *, resolve: Resolve | None = None
    ) -> None:
        self.list_path = list_path
        self.limits = limits
        self.engine = engine
        self.resolve = resolve
        self._lock = threading.Lock()
        self._states: dict[str, AdapterState] = {}
        self._loaded: dict[str, _Loaded] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._text: str | None = None
        self._retry = False
        self._settled = threading.Event()
        self.list_error: str | None = None

    # ----- what /status and /metrics read -----

    def document(self) -> list[dict[str, Any]]:
        with self._lock:
            return [state.to_dict() for state in self._states.values()]

    def loaded(self) -> dict[str, bool]:
        with self._lock:
            return {name: state.state == LOADED for name, state in self._states.items()}

    def settled(self) -> bool:
        """The first sync with the engine is done (every listed adapter loaded or failed)."""
        return self._settled.is_set()

    # ----- the work -----

    def preview(self) -> None:
        """Before the engine runs: every listed adapter pending (or failed by its checks, or refused)."""
        found = self._read()
        if found is None:
            return
        for source in self._accepted(found[1]):
            if source.path is not None:
                try:
                    check_adapter(source.path, self.limits.max_rank)
                except AdapterError as exc:
                    self._set(AdapterState(source.name, FAILED, exc.reason, exc.message))
                    continue
            self._set(AdapterState(source.name, PENDING))

    def poll(self) -> bool:
        """One step: apply the list when it changed (or an unload is to be retried); True when it did."""
        try:
            if not self._changed() and not self._retry:
                return False
            found = self._read()
            if found is None:
                return False
            text, adapters = found
            if text == self._text and not self._retry:
                return False
            self._text = text
            self.apply(adapters)
            return True
        except Exception as exc:  # never into serve: the adapters loaded keep serving
            log(f"sync failed: {type(exc).__name__}: {exc}")
            return False
        finally:
            self._settled.set()

    def run(self, stop: threading.Event, interval: float = SYNC_SECONDS) -> None:
        """Poll until `stop` is set (the first poll at once)."""
        while True:
            self.poll()
            if stop.wait(interval):
                return

    def apply(self, adapters: AdapterList) -> None:
        """Load, unload and reload what differs between the engine and `adapters`."""
        self._retry = False
        accepted = {source.name: source for source in self._accepted(adapters)}
        for name in [name for name in self._loaded if name not in accepted]:
            if self._unload(name):
                self._drop(name)
        for source in accepted.values():
            held = self._loaded.get(source.name)
            if held is not None and held.source.key() == source.key():
                continue
            if held is not None and not self._unload(source.name):
                continue
            self._set(AdapterState(source.name, PENDING))
            self._load(source, adapters.cache)
        with self._lock:
            for name in [name for name in self._states if name not in {s.name for s in adapters.adapters}]:
                if name not in self._loaded:
                    del self._states[name]

    def _accepted(self, adapters: AdapterList) -> list[AdapterSource]:
        """The first max_adapters of the list; the others are refused (TooManyAdapters)."""
        limit = self.limits.max_adapters
        for source in adapters.adapters[limit:]:
            message = f"more than {self.limits.max_adapters_flag} {limit} adapters listed"
            self._set(AdapterState(source.name, FAILED, TOO_MANY_ADAPTERS, message))
        return list(adapters.adapters[:limit])

    def _load(self, source: AdapterSource, cache: str | None) -> None:
        try:
            path = self._path(source, cache)
            check_adapter(path, self.limits.max_rank)
            self.engine.load(source.name, path)
        except AdapterError as exc:
            log(f"{source.name}: {exc}")
            self._set(AdapterState(source.name, FAILED, exc.reason, exc.message))
            return
        except Exception as exc:  # an engine that went away, a bug of ours: this adapter fails, not serve
            log(f"{source.name}: {type(exc).__name__}: {exc}")
            self._set(AdapterState(source.name, FAILED, ADAPTER_LOAD_FAILED, f"{type(exc).__name__}: {exc}"))
            return
        with self._lock:
            self._loaded[source.name] = _Loaded(source, path)
        log(f"{source.name}: loaded from {path}")
        self._set(AdapterState(source.name, LOADED))

    def _path(self, source: AdapterSource, cache: str | None) -> str:
        if source.path is not None:
            return source.path
        if self.resolve is None:
            raise AdapterError(
                ADAPTER_FETCH_FAILED, "a hub adapter needs `npu-runtime serve` (its fetch); use a path instead"
            )
        return self.resolve(source, cache)

    def _unload(self, name: str) -> bool:
        try:
            self.engine.unload(name)
        except Exception as exc:
            reason = exc.reason if isinstance(exc, AdapterError) else ADAPTER_UNLOAD_FAILED
            message = exc.message if isinstance(exc, AdapterError) else f"{type(exc).__name__}: {exc}"
            log(f"{name}: {message}")
            self._set(AdapterState(name, LOADED, reason, message))
            self._retry = True
            return False
        with self._lock:
            self._loaded.pop(name, None)
        log(f"{name}: unloaded")
        return True

    def _set(self, state: AdapterState) -> None:
        with self._lock:
            self._states[state.name] = state

    def _drop(self, name: str) -> None:
        with self._lock:
            self._states.pop(name, None)

    # ----- the file -----

    def _changed(self) -> bool:
        """The file's identity (inode, size, mtime) differs from the one last read."""
        try:
            found = os.stat(self.list_path)
        except OSError:
            stamp = None
        else:
            stamp = (found.st_ino, found.st_size, found.st_mtime_ns)
        if stamp is not None and stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    def _read(self) -> tuple[str, AdapterList] | None:
        """The file's text and its list; None when it cannot be read (`list_error` says why)."""
        try:
            with open(self.list_path, "rb") as handle:
                data = handle.read(MAX_LIST_BYTES + 1)
            if len(data) > MAX_LIST_BYTES:
                raise AdapterListError(self.list_path, f"larger than {MAX_LIST_BYTES} bytes")
            text = data.decode("utf-8")
            body = json.loads(text)
            if not isinstance(body, dict):
                raise AdapterListError(self.list_path, "must be a JSON object")
            adapters = parse_adapter_list(body)
        except FileNotFoundError:
            self._list_failed(f"--lora-adapters {self.list_path}: no such file")
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self._list_failed(f"--lora-adapters {self.list_path}: {exc}")
            return None
        if self.list_error is not None:
            log(f"--lora-adapters {self.list_path}: readable again")
        self.list_error = None
        return text, adapters

    def _list_failed(self, message: str) -> None:
        if message != self.list_error:
            log(f"{message}; the adapters loaded keep serving")
        self.list_error = message
