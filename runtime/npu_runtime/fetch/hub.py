"""The `Hub` interface and what every hub and the fetch share: hub names, reasons, options, errors."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, Protocol

from npu_runtime.fetch import layout
from npu_runtime.fetch.listing import Listing, RemoteFile
from npu_runtime.fetch.verify import Verification

HUGGING_FACE: Final = "huggingface"
MODEL_SCOPE: Final = "modelscope"
HUBS: Final = (HUGGING_FACE, MODEL_SCOPE)
# The branch each hub's fetch takes when no revision is given.
DEFAULT_REVISIONS: Final = {HUGGING_FACE: "main", MODEL_SCOPE: "master"}
CONFIG_FILE: Final = "config.json"
DEFAULT_LOCK_TIMEOUT: Final = 1800.0

# Reasons (the operator's Degraded reasons, a contract like failures.REASONS).
ACCESS_DENIED: Final = "ModelAccessDenied"
NOT_FOUND: Final = "ModelNotFound"
CACHE_FULL: Final = "ModelCacheFull"
HASH_MISMATCH: Final = "ModelHashMismatch"
DOWNLOAD_FAILED: Final = "ModelDownloadFailed"
REASONS: Final = (ACCESS_DENIED, NOT_FOUND, CACHE_FULL, HASH_MISMATCH, DOWNLOAD_FAILED)


class FetchError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclasses.dataclass(frozen=True)
class FetchOptions:
    hub: str
    repo: str
    revision: str | None
    cache: Path
    allow: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    endpoint: str | None = None
    token: str | None = None
    link: Path | None = None
    # A waiter gives up after this long without the lock holder's progress moving.
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT


class Hub(Protocol):
    default_revision: str

    def repo_folder(self, options: FetchOptions) -> Path: ...
    def drop_orphans(self, options: FetchOptions) -> None: ...
    def resolve(self, options: FetchOptions) -> Listing: ...
    def verification(self, listing: Listing) -> Verification: ...
    def download(
        self, options: FetchOptions, listing: Listing, names: Sequence[str], verification: Verification
    ) -> Path: ...
    def verified_by_download(
        self, options: FetchOptions, snapshot: Path, remote: RemoteFile, verification: Verification
    ) -> str | None: ...
    def measure(self, folder: Path, listing: Listing, verification: Verification) -> tuple[int, int]: ...
    def classify(self, exc: BaseException) -> FetchError | None: ...


def not_a_hub(name: str) -> ValueError:
    return ValueError(f"--hub: {name!r} is not one of {', '.join(HUBS)}")


def fetch_label(options: FetchOptions) -> str:
    """The repository as the fetch's messages name it: `<hub> <repo>@<revision>`."""
    if options.hub not in DEFAULT_REVISIONS:
        raise not_a_hub(options.hub)
    return f"{options.hub} {options.repo}@{options.revision or DEFAULT_REVISIONS[options.hub]}"


def log(message: str) -> None:
    print(f"npu-runtime fetch: {message}", file=sys.stderr, flush=True)


def library_cache(options: FetchOptions) -> Path:
    return layout.library_cache(options.cache, options.hub, options.endpoint)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then its causes (or else contexts), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
