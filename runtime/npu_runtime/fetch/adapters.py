"""LoRA adapters from a hub, fetched as the model is: into the list's cache, once, each file verified.

- `fetch_adapter`: one adapter of the list (`npu_runtime.adapters`) downloaded by `driver.fetch`
  (the same listing checks, lock, verification and completion marker as the model's), its snapshot
  directory returned. Its failures are the adapter's (serving.lora's AdapterFetchFailed, the
  fetch's reason and message in it), never the runtime's.
- `fetch_listed`: `npu-runtime fetch --adapters FILE`, the init container's part: every hub adapter of
  the list, each with its own `Progress` (shown on the fetch's /status beside the model's). One that
  fails is reported (phase Failed, its reason) and the others go on: the model still serves, and
  `serve` tries the adapter again when it loads it.
- `serve_command`: `npu-runtime serve` with the hub fetch handed in. The import layers
  (pyproject.toml) put `npu_runtime.fetch` above `npu_runtime.serving`: the fetch reports with
  serving's failure reasons, so serving may not import the fetch. Rather than a lazy import, the
  command entry injects it: cli's COMMANDS name this function for `serve`, and it gives
  `serving.serve.serve_command` `fetch_adapter` as its `resolve_adapter`.

The token is NPU_MODEL_TOKEN, the model's (the operator's Secret), and is sent to https:// endpoints
(or the hub's default one) only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from npu_runtime.adapters import AdapterList, AdapterSource
from npu_runtime.fetch import driver
from npu_runtime.fetch.hub import FetchError, FetchOptions, log
from npu_runtime.fetch.hubs import TOKEN_ENV, hub_for
from npu_runtime.fetch.progress import Progress
from npu_runtime.serving import lora, serve


def adapter_options(source: AdapterSource, cache: str | Path) -> FetchOptions:
    """The fetch of a hub adapter (`source.hub` set) into `cache`."""
    assert source.hub is not None and source.repository is not None
    token = os.environ.get(TOKEN_ENV) or None
    if source.endpoint is not None and not source.endpoint.startswith("https://"):
        token = None  # never in clear text
    return FetchOptions(
        hub=source.hub,
        repo=source.repository,
        revision=source.revision,
        cache=Path(cache),
        endpoint=source.endpoint,
        token=token,
    )


def adapter_progress(source: AdapterSource) -> Progress:
    return Progress(source=str(source.hub), repository=str(source.repository), revision=source.revision)


def fetch_adapter(source: AdapterSource, cache: str | None, progress: Progress | None = None) -> str:
    """The adapter's snapshot directory, downloaded into `cache` when needed; AdapterError when it cannot be."""
    if cache is None:
        raise lora.AdapterError(lora.ADAPTER_FETCH_FAILED, "cache: is required when an adapter comes from a hub")
    progress = progress or adapter_progress(source)
    try:
        options = adapter_options(source, cache)
        return str(driver.fetch(options, hub_for(options.hub), progress))
    except FetchError as exc:
        progress.phase, progress.reason, progress.message = "Failed", exc.reason, exc.message
        raise lora.AdapterError(lora.ADAPTER_FETCH_FAILED, f"{exc.reason}: {exc.message}") from exc


def hub_adapters(adapters: AdapterList) -> list[AdapterSource]:
    return [source for source in adapters.adapters if source.hub is not None]


def fetch_listed(adapters: AdapterList, progresses: Sequence[Progress]) -> int:
    """Every hub adapter of the list, one after another, each into its progress; how many failed."""
    failed = 0
    for source, progress in zip(hub_adapters(adapters), progresses, strict=True):
        try:
            path = fetch_adapter(source, adapters.cache, progress)
        except lora.AdapterError as exc:
            failed += 1
            log(f"adapter {source.name}: {exc.message}")
            continue
        log(f"adapter {source.name}: {progress.files_total} files, {progress.bytes_total} bytes ready at {path}")
    return failed


def serve_command(argv: Sequence[str]) -> int:
    """`npu-runtime serve ARGS` with hub adapters fetched by `fetch_adapter`."""
    return serve.serve_command(argv, resolve_adapter=fetch_adapter)
