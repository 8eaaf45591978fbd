"""The LoRA adapter list: the file the operator writes (a ConfigMap key, mounted into the engine pods)
and `npu-runtime serve` and `npu-runtime fetch` read. Pure: no I/O beyond `read_adapter_list`.

One adapter is a name (the model name clients send) and where its files are: a `path` inside the pod
(a claim or host path the operator mounted), or a hub repository (`hub` "huggingface" or
"modelscope", `repository`, `revision`, `endpoint`) that the runtime downloads into `cache` with the
same verification as the model. The file is re-read while the engine serves, so adding or removing
an adapter needs no restart; the limits (max loras, rank) are the plan's flags, not this file's.

    {"base_model": "qwen", "cache": "/var/run/npu-lora",
     "adapters": [{"name": "sql", "path": "/var/run/npu-lora-volumes/0/sql"},
                  {"name": "chat", "hub": "huggingface", "repository": "org/chat-lora", "revision": "v1"}]}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

ADAPTER_LIST_FILE: Final = "adapters.json"
HUBS: Final = ("huggingface", "modelscope")


class AdapterListError(ValueError):
    """The adapter list cannot be read: `field` names the entry (e.g. adapters[1].repository)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclasses.dataclass(frozen=True)
class AdapterSource:
    """One adapter: its served name and where its files are (a path, or a hub repository)."""

    name: str
    path: str | None = None
    hub: str | None = None
    repository: str | None = None
    revision: str | None = None
    endpoint: str | None = None

    def key(self) -> tuple[str | None, ...]:
        """What identifies the files: a changed key is a new adapter under the same name."""
        return (self.path, self.hub, self.repository, self.revision, self.endpoint)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class AdapterList:
    base_model: str
    cache: str | None
    adapters: tuple[AdapterSource, ...]

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"base_model": self.base_model, "adapters": [a.to_json() for a in self.adapters]}
        if self.cache is not None:
            body["cache"] = self.cache
        return body

    def text(self) -> str:
        """The file's text: sorted keys, one line, so that the same list is the same bytes."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")) + "\n"


def parse_adapter_list(body: Mapping[str, Any]) -> AdapterList:
    """The list from its JSON; AdapterListError names the first entry that is wrong."""
    base = body.get("base_model")
    if not isinstance(base, str) or not base:
        raise AdapterListError("base_model", "must be the base model's served name")
    cache = body.get("cache")
    if cache is not None and not isinstance(cache, str):
        raise AdapterListError("cache", "must be a directory")
    entries = body.get("adapters", [])
    if not isinstance(entries, list):
        raise AdapterListError("adapters", "must be a list")
    adapters: list[AdapterSource] = []
    for index, entry in enumerate(entries):
        adapters.append(_adapter(f"adapters[{index}]", entry, hub_cache=cache))
    names = [a.name for a in adapters]
    if duplicate := next((n for n in names if names.count(n) > 1), None):
        raise AdapterListError("adapters", f"the name {duplicate!r} is listed twice")
    if base in names:
        raise AdapterListError("adapters", f"the name {base!r} is the base model's")
    return AdapterList(base, cache, tuple(adapters))


def _adapter(field: str, entry: Any, *, hub_cache: str | None) -> AdapterSource:
    if not isinstance(entry, Mapping):
        raise AdapterListError(field, "must be an object")
    strings = {k: v for k, v in entry.items() if k in {f.name for f in dataclasses.fields(AdapterSource)}}
    for key, value in strings.items():
        if not isinstance(value, str) or not value:
            raise AdapterListError(f"{field}.{key}", "must be a non-empty string")
    if "name" not in strings:
        raise AdapterListError(f"{field}.name", "is required")
    source = AdapterSource(**strings)
    if (source.path is None) == (source.hub is None):
        raise AdapterListError(field, "needs exactly one of path and hub")
    if source.hub is not None:
        if source.hub not in HUBS:
            raise AdapterListError(f"{field}.hub", f"must be one of {', '.join(HUBS)}")
        if source.repository is None:
            raise AdapterListError(f"{field}.repository", "is required with a hub")
        if hub_cache is None:
            raise AdapterListError("cache", "is required when an adapter comes from a hub")
    return source


def read_adapter_list(path: str | Path) -> AdapterList:
    """The list in the file at `path`; a missing file is AdapterListError (the pod has no list yet)."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdapterListError(str(path), "no such file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterListError(str(path), f"cannot be read: {exc}") from None
    if not isinstance(body, dict):
        raise AdapterListError(str(path), "must be a JSON object")
    return parse_adapter_list(body)
