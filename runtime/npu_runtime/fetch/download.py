"""`npu-runtime fetch`: a model repository from Hugging Face or ModelScope into the shared cache, once.

Runs as the pod's init container (the runtime image), before `npu-runtime serve`:

    npu-runtime fetch --hub huggingface --repo Qwen/Qwen2.5-7B-Instruct [--revision REV] \
        --cache /models [--allow PATTERN]... [--ignore PATTERN]... [--endpoint URL] --link /run/npu-model/model

The download itself is the hub's own client library (`huggingface_hub.snapshot_download`,
`modelscope.snapshot_download`): their cache layout, their resume with HTTP Range (both within a
process; modelscope also across processes, huggingface_hub 1.x never reuses a killed process's
partial file, which the next holder of the lock removes), their retries. This module adds what a
shared cache volume needs around them:

- **A hub is untrusted input** (`listing`): the revision is resolved to a commit (40 hex digits,
  both hubs), every listed path must be relative and inside the snapshot, and this is checked
  before anything is written, linked or deleted. Files are handed to the library as names, not
  patterns. A Hugging Face body longer than its listed size is cut off while it streams (the
  modelscope library stops at the listed size itself).
- **Cache keyed by endpoint** (`layout`): each endpoint has its own folder under `<cache>/<hub>/`,
  so one endpoint's answers never reach the files another endpoint's resources serve.
- **One download per repository at a time.** A file lock on the cache volume
  (`<cache>/.npu/locks/<hub>/<endpoint key>/<owner>--<name>.lock`) covers the repository's blobs.
  The first replica downloads; the others wait on the lock (showing the holder's progress,
  which it writes beside the lock) and find the revision complete. A lock, not a Job per
  revision: no extra controller, objects or RBAC, and it works for every resource and replica
  that mounts the same volume, across namespaces' PVCs that bind one volume. The kernel drops
  the lock when its holder dies, so a killed pod never blocks the next one, which takes the
  download over; a waiter gives up after `--lock-timeout` seconds in which the holder's
  progress did not move.
- **Complete means checked**, and checked while the bytes arrive (`verify`). Every file's size and
  hash must match the hub's listing (sha256 for LFS files and every ModelScope file, the git blob
  sha1 for the rest): a Hugging Face body is hashed as the library reads it (the check on its
  HTTP client) and a wrong one raises before the library keeps it; modelscope_hub hashes what it
  streams against the sha256 and size this fetch's listing hands it. Only what neither covered
  (a file already in the cache, a body compressed or resumed elsewhere than where its hash was, a
  client version without the seams) is hashed from disk after the download. A file that does not
  match is fetched again once; twice wrong is `ModelHashMismatch`. Files in the snapshot that
  the listing does not name are removed. Only then is the marker
  `<repo folder>/.npu-complete/<commit>.json` written; later pods trust it when the hub's
  listing still matches it and every file is still there with its size.
- **A snapshot is never rewritten for a commit it already holds.** A hub that lists other sizes
  or hashes under a commit the marker records (a commit names its bytes) is ModelHashMismatch:
  nothing is downloaded, removed or re-linked, and the replicas that link the snapshot keep it.
- **A branch is a commit.** Both hubs' branches and tags are resolved to the commit they point
  at, and the snapshot is that commit's: a branch that moves makes a new snapshot, never a
  rewritten one under a running replica. The operator resolves a branch once per rollout: the
  rollout's first pods fetch with `--hold` (fetch, report the commit on /status, never exit),
  and every pod after them gets the commit they reported as `--revision`.
- **config.json first**, so the model can be planned (`--plan` runs `npu-runtime plan` with
  the given flags) before gigabytes of weights arrive: a model that cannot fit fails in seconds.
- **Progress** (`--status-port`, on `--status-host`, all addresses by default): `/status` answers
  `{"model": {...}}` with the phase, bytes done/total and files, which the operator folds into
  `status.model`. The bytes done are the verified ones: files whose hash matched, and the hashed
  part of the files in flight.
- **The end** is one line in the termination message: `ModelReady: {...}` (the final progress,
  resolved revision included), or `<Reason>: <message>` naming the repository, also on stderr:
  ModelAccessDenied (401/403), ModelNotFound (repository, revision or file), ModelCacheFull (no
  space on the cache volume), ModelHashMismatch, ModelDownloadFailed.

The token comes from the environment variable `NPU_MODEL_TOKEN` (a Secret, set by the operator
with `valueFrom`), is handed to the library only, and is never printed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import errno
import fnmatch
import http.server
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from npu_runtime.fetch import layout
from npu_runtime.fetch.listing import (
    Listing,
    ListingError,
    RemoteFile,
    as_name,
    check_commit,
    check_path,
    check_repository,
    check_revision,
    checked,
    is_commit,
)
from npu_runtime.fetch.verify import (
    BY_CLIENT,
    FROM_DISK,
    STREAMED,
    BodyMismatch,
    Identity,
    StreamHash,
    Verification,
    expected_digest,
    identity,
    new_hash,
)
from npu_runtime.serving import failures
from npu_runtime.serving.failures import Failure, write_termination_message

__all__ = ["FetchError", "FetchOptions", "Listing", "Progress", "RemoteFile", "fetch", "fetch_command"]

HUGGING_FACE: Final = "huggingface"
MODEL_SCOPE: Final = "modelscope"
HUBS: Final = (HUGGING_FACE, MODEL_SCOPE)
TOKEN_ENV: Final = "NPU_MODEL_TOKEN"
CONFIG_FILE: Final = "config.json"
DEFAULT_TERMINATION_LOG: Final = "/dev/termination-log"

# Reasons (the operator's Degraded reasons, a contract like failures.REASONS).
ACCESS_DENIED: Final = "ModelAccessDenied"
NOT_FOUND: Final = "ModelNotFound"
CACHE_FULL: Final = "ModelCacheFull"
HASH_MISMATCH: Final = "ModelHashMismatch"
DOWNLOAD_FAILED: Final = "ModelDownloadFailed"
REASONS: Final = (ACCESS_DENIED, NOT_FOUND, CACHE_FULL, HASH_MISMATCH, DOWNLOAD_FAILED)
READY: Final = "ModelReady"  # the success line: `ModelReady: {progress as JSON}`

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_INVALID: Final = 2  # access denied, not found: retrying does not help
EXIT_DOES_NOT_FIT: Final = 3  # as `npu-runtime plan`
# Besides its own reasons, a fetch that plans ends with the planner's (they are the runtime's failures).
PLAN_REASONS: Final = (failures.MODEL_DOES_NOT_FIT, failures.INVALID_CONFIGURATION, failures.MODEL_INVALID)
EXIT_CODES: Final = {
    ACCESS_DENIED: EXIT_INVALID,
    NOT_FOUND: EXIT_INVALID,
    failures.INVALID_CONFIGURATION: EXIT_INVALID,
    failures.MODEL_INVALID: EXIT_INVALID,
    failures.MODEL_DOES_NOT_FIT: EXIT_DOES_NOT_FIT,
}
_CHUNK: Final = 8 << 20
_CONFIG_CHUNK: Final = 64 << 10
DEFAULT_LOCK_TIMEOUT: Final = 1800.0


OnConfig = Callable[[Path], None]  # called with the snapshot directory once config.json is in it


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


@dataclasses.dataclass
class Progress:
    """What `/status` and the progress file say: the shape of the operator's status.model."""

    source: str
    repository: str
    revision: str | None = None
    phase: str = "Resolving"  # Resolving, Waiting, Downloading, Verifying, Ready, Failed
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    reason: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "source": self.source,
            "repository": self.repository,
            "revision": self.revision,
            "phase": self.phase,
            "bytesDone": self.bytes_done,
            "bytesTotal": self.bytes_total,
            "filesDone": self.files_done,
            "filesTotal": self.files_total,
            "reason": self.reason,
            "message": self.message,
        }
        return {key: value for key, value in out.items() if value is not None}


# --- the hubs -------------------------------------------------------------------------------------


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


def _log(message: str) -> None:
    print(f"npu-runtime fetch: {message}", file=sys.stderr, flush=True)


class HuggingFaceHub:
    """`huggingface_hub`: its standard cache (`models--org--name/{blobs,snapshots/<commit>}`), per endpoint.

    Each file is hashed while its body streams, by the check on the library's HTTP client
    (`_guard_huggingface_hub`); huggingface_hub itself compares only the size, after the body.
    """

    default_revision = "main"

    def repo_folder(self, options: FetchOptions) -> Path:
        return _library_cache(options) / ("models--" + layout.repository_name(options.repo))

    def drop_orphans(self, options: FetchOptions) -> None:
        """Partial files of killed downloads: huggingface_hub 1.x writes to a file unique to the process
        and never reuses it (huggingface_hub#4228), so under our lock nobody else's is in flight. And
        the library's own tree listings: this fetch has its checked listing, the library lists again."""
        folder = self.repo_folder(options)
        for orphan in (folder / "blobs").glob("*.incomplete"):
            orphan.unlink(missing_ok=True)
        _remove_tree(folder / "trees", folder)

    def resolve(self, options: FetchOptions) -> Listing:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile as HfRepoFile

        _guard_huggingface_hub()
        api = HfApi(endpoint=options.endpoint, token=options.token or False)
        revision = options.revision or self.default_revision
        commit = check_commit(api.repo_info(options.repo, revision=revision).sha)
        if is_commit(revision) and commit != revision:
            raise ListingError(f"the hub resolved commit {revision} to another commit, {commit}")
        files = [
            RemoteFile(f.path, f.size, f.lfs.sha256 if f.lfs else None, None if f.lfs else f.blob_id)
            for f in api.list_repo_tree(options.repo, recursive=True, revision=commit)
            if isinstance(f, HfRepoFile)
        ]
        return Listing(commit, tuple(files))

    def verification(self, listing: Listing) -> Verification:
        seam = _huggingface_stream_seam()
        if seam is not None:
            _log(f"{seam}: every file is hashed from disk, each as soon as it is downloaded")
            return Verification(listing)
        from huggingface_hub import constants

        # The library reads its bodies in chunks of this many bytes (file_download.http_get:
        # `response.iter_bytes(chunk_size=constants.DOWNLOAD_CHUNK_SIZE)`, read at each call) and
        # writes each whole chunk. Its 10 MiB makes httpx's ByteChunker copy every chunk through
        # fresh 10 MiB buffers, about as much CPU as hashing the bytes; 1 MiB (what modelscope_hub
        # writes in) pays for the hash. The check hands the library exactly such chunks (`Checked`).
        constants.DOWNLOAD_CHUNK_SIZE = _HF_WRITE_CHUNK
        return Verification(listing, streaming=True)

    def download(
        self, options: FetchOptions, listing: Listing, names: Sequence[str], verification: Verification
    ) -> Path:
        from huggingface_hub import hf_hub_download, snapshot_download

        _guard_huggingface_hub()
        _BODIES.expect(options.repo, listing, verification)
        if len(names) == 1:  # config.json first: one file, without the revision and tree requests around it
            path = hf_hub_download(
                options.repo,
                names[0],
                revision=listing.commit,
                cache_dir=_library_cache(options),
                endpoint=options.endpoint,
                token=options.token or False,
            )
            return Path(path).parents[len(names[0].split("/")) - 1]
        return Path(
            snapshot_download(
                options.repo,
                revision=listing.commit,
                cache_dir=_library_cache(options),
                allow_patterns=[as_name(name) for name in names],
                endpoint=options.endpoint,
                token=options.token or False,
            )
        )

    def verified_by_download(
        self, options: FetchOptions, snapshot: Path, remote: RemoteFile, verification: Verification
    ) -> str | None:
        """STREAMED when the file's body was hashed as it arrived and matched, and the snapshot's entry is
        the blob that body was written to. huggingface_hub names a blob after the ETag the hub answers
        (`blobs/<etag>`) and skips the download when that blob exists, so the entry must lead to the
        blob named by the listed hash, and every ETag of this fetch must be the listed hash of its own
        file: otherwise a body verified as one file could have been written under another's blob name."""
        digest = expected_digest(remote)
        if digest is None or not verification.streamed(remote.path):
            return None
        if verification.etags_of(remote.path) != {digest} or not verification.etags_agree():
            return None
        blob = self.repo_folder(options) / "blobs" / digest
        try:
            if os.path.realpath(snapshot / remote.path) != os.path.realpath(blob) or blob.is_symlink():
                return None
            return STREAMED if blob.stat().st_size == remote.size else None
        except OSError:
            return None

    def measure(self, folder: Path, listing: Listing, verification: Verification) -> tuple[int, int]:
        return verification.bytes_done(), verification.files_done()

    def classify(self, exc: BaseException) -> FetchError | None:
        from huggingface_hub import errors

        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, errors.GatedRepoError) or status in (401, 403):
            return FetchError(ACCESS_DENIED, f"the hub refused access (HTTP {status}); check the token's Secret")
        if isinstance(exc, errors.RevisionNotFoundError):
            return FetchError(NOT_FOUND, "revision not found")
        if isinstance(exc, errors.RepositoryNotFoundError):
            return FetchError(NOT_FOUND, "repository not found")
        # RemoteEntryNotFoundError from huggingface_hub 1.0; EntryNotFoundError before.
        entry_not_found = getattr(errors, "RemoteEntryNotFoundError", None) or errors.EntryNotFoundError
        if isinstance(exc, entry_not_found):
            return FetchError(NOT_FOUND, "a file of the repository was not found")
        return None


# The huggingface_hub versions whose download path (file_download.http_get and
# _download_to_tmp_and_move) was read for hashing while streaming: 1.x.
_HF_STREAM_MAJOR: Final = 1
_HF_WRITE_CHUNK: Final = 1 << 20


def _huggingface_stream_seam() -> str | None:
    """None when huggingface_hub's bodies can be hashed while they stream; else why not."""
    import huggingface_hub
    from huggingface_hub import constants

    version = str(getattr(huggingface_hub, "__version__", "?"))
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) != _HF_STREAM_MAJOR:
        return f"huggingface_hub {version} is not a version whose download was checked ({_HF_STREAM_MAJOR}.x)"
    if not hasattr(huggingface_hub, "set_client_factory"):
        return f"huggingface_hub {version} has no set_client_factory"
    if not isinstance(getattr(constants, "DOWNLOAD_CHUNK_SIZE", None), int):
        return f"huggingface_hub {version} has no constants.DOWNLOAD_CHUNK_SIZE"
    return None


@dataclasses.dataclass(frozen=True)
class _Body:
    repo: str
    remote: RemoteFile
    verification: Verification


class _ExpectedBodies:
    """What this process's fetches expect from Hugging Face endpoints: each listed file by the URL path
    suffix `/<repo>/resolve/<commit>/<path>` (and by the URL a hub redirected it to), with the
    fetch's Verification; and the commit each revision answer must name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bodies: dict[str, _Body] = {}
        self.aliases: dict[str, _Body] = {}  # full URL -> body: where a hub's answer for a file points
        self.commits: dict[str, str] = {}  # "/api/models/<repo>/revision/<commit>" -> commit

    def expect(self, repo: str, listing: Listing, verification: Verification) -> None:
        with self._lock:
            for remote in listing.files:
                self.bodies[f"/{repo}/resolve/{listing.commit}/{remote.path}"] = _Body(repo, remote, verification)
            self.commits[f"/api/models/{repo}/revision/{listing.commit}"] = listing.commit

    def forget(self, verification: Verification) -> None:
        with self._lock:
            for table in (self.bodies, self.aliases):
                for key in [key for key, body in table.items() if body.verification is verification]:
                    del table[key]

    def body(self, url: str, path: str) -> _Body | None:
        """The listed file a request is for: by its URL path's suffix (exactly one), else by an alias."""
        with self._lock:
            found = {
                id(body): body
                for at in range(len(path))
                if path[at] == "/" and (body := self.bodies.get(path[at:])) is not None
            }
            if len(found) == 1:
                return next(iter(found.values()))
            return self.aliases.get(url) if not found else None

    def alias(self, url: str, body: _Body) -> None:
        with self._lock:
            self.aliases[url] = body

    def commit(self, path: str) -> str | None:
        with self._lock:
            return next((commit for suffix, commit in self.commits.items() if path.endswith(suffix)), None)


_BODIES: Final = _ExpectedBodies()
_GUARDED: list[bool] = []


class _BodyTooLong(Exception):
    """A file's body went past its listed size (a hostile or broken endpoint)."""


def _normalize_etag(value: str) -> str:
    """As huggingface_hub names a blob after an ETag (file_download._normalize_etag, 1.x)."""
    return value.lstrip("W/").strip('"')


def _guard_huggingface_hub() -> None:
    """huggingface_hub's HTTP client, with a check on what the library reads from the endpoint:

    - a listed file's body stops at its listed size while it streams (the library compares sizes
      only after the whole body is on disk), and feeds the file's hash (`verify.StreamHash`), whose
      digest is compared when the body ends: a body that does not match raises inside the library's
      read, so the library never moves it into its cache (`_download_to_tmp_and_move` removes its
      temporary file);
    - the ETag the hub answers for a listed file is recorded (the library names the file's blob
      after it), and a redirect's Location is remembered as the file's, for the GET that follows;
    - a revision answer for a pinned commit must name that commit (the library builds its snapshot
      and tree-cache paths from it).

    Through the library's documented hook, `huggingface_hub.set_client_factory`, keeping its
    default client's own event hooks (huggingface_hub v1.x, utils/_http.py); the body is replaced
    in a response event hook with an `httpx.SyncByteStream`, which `Response.iter_bytes` (what
    file_download.http_get reads) draws from."""
    if _GUARDED:
        return
    import httpx
    from huggingface_hub import constants, set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    class Checked(httpx.SyncByteStream):
        """A listed file's body: cut off past its listed size, and, where it is hashed, handed on in
        whole chunks of the library's read size, each hashed as it is handed on. httpx's ByteChunker
        (`Response.iter_bytes(chunk_size)`, which http_get reads) then passes each one through as it
        comes, so the library writes exactly what was hashed: a cut body leaves the library's file
        where the hash is, and the Range request that resumes it starts there (`StreamHash.resume`).
        It is also cheaper than the 64 KiB pieces the connection reads: one copy per chunk instead of
        ByteChunker's, one hash call instead of sixteen."""

        def __init__(
            self, inner: Any, limit: int, path: str, hashed: StreamHash | None, verification: Verification
        ) -> None:
            self.inner, self.limit, self.path, self.hashed, self.verification = inner, limit, path, hashed, verification

        def __iter__(self) -> Iterator[bytes]:
            seen, limit, hashed = 0, self.limit, self.hashed
            if hashed is None:
                for chunk in self.inner:
                    seen += len(chunk)
                    if seen > limit:
                        raise _BodyTooLong(f"{self.path}: the endpoint sent more bytes than the {limit} listed")
                    yield chunk
                return
            size = constants.DOWNLOAD_CHUNK_SIZE
            pending: list[bytes] = []
            held = 0
            for chunk in self.inner:
                seen += len(chunk)
                if seen > limit:
                    raise _BodyTooLong(f"{self.path}: the endpoint sent more bytes than the {limit} listed")
                while held + len(chunk) >= size:
                    cut = size - held
                    pending.append(chunk[:cut])
                    piece = b"".join(pending)
                    hashed.update(piece)
                    yield piece
                    chunk, pending, held = chunk[cut:], [], 0
                if chunk:
                    pending.append(chunk)
                    held += len(chunk)
            if pending:
                piece = b"".join(pending)
                hashed.update(piece)
                yield piece  # shorter than a chunk: the library writes it only after the body ended...
            self.verification.ended(self.path, hashed)  # ...and BodyMismatch stops it before

        def close(self) -> None:
            self.inner.close()

    def check(response: httpx.Response) -> None:
        request = response.request
        first = response.history[0].request if response.history else request
        path = urllib.parse.unquote(first.url.path)
        if (commit := _BODIES.commit(path)) is not None and response.status_code == 200:
            response.read()
            if response.json().get("sha") != commit:
                raise ListingError(f"the hub answered another commit than {commit} for it")
        body = _BODIES.body(str(first.url), path)
        if body is None:
            return
        remote, verification = body.remote, body.verification
        if response.is_redirect and (location := response.headers.get("Location")):
            _BODIES.alias(str(request.url.join(location)), body)  # the library may GET it there itself
        if first.method == "HEAD":
            if etag := response.headers.get("X-Linked-Etag") or response.headers.get("ETag"):
                verification.etag(remote.path, _normalize_etag(etag))
            return
        if first.method != "GET" or response.status_code not in (200, 206):
            return
        start = 0
        if response.status_code == 206:
            ranged = re.fullmatch(r"bytes=(\d+)-", request.headers.get("Range", "").strip())
            start = int(ranged[1]) if ranged else -1
        hashed = None
        if verification.streaming:
            if response.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
                verification.not_hashable(remote.path, "its body came compressed")
            elif start < 0:
                verification.not_hashable(remote.path, "a partial body without a plain Range request")
            else:
                hashed = verification.body(remote.path, start)
        response.stream = Checked(
            response.stream, max(remote.size - max(start, 0), 0), remote.path, hashed, verification
        )

    def guarded_client() -> httpx.Client:
        client = default_client_factory()
        client.event_hooks["response"] = [*client.event_hooks["response"], check]
        return client

    set_client_factory(guarded_client)
    _GUARDED.append(True)


class ModelScopeHub:
    """`modelscope`: its cache (`models/org--name/snapshots/<commit>`) in the endpoint's folder.

    ModelScope's file API takes a branch, tag or commit but answers no commit for a branch: the
    branch or tag is resolved to its commit with the repository's revision list first, and the
    files are listed and downloaded at that commit, so a branch that moves makes a new snapshot.

    The library verifies each file itself, against this fetch's listing: the files are handed to
    `HubApi.download_repo` as its `file_list` (path, size, sha256; modelscope_hub 0.5, api.py),
    so the library does not list them again, and for each it checks what it streams against
    that size and sha256 (`DownloadManager._download_with_resume` hashes every chunk as it writes
    it, re-hashes a resumed `.incomplete` prefix from disk first, stops at the listed size;
    `_parallel_download` hashes the parts as it joins them; `_finish_download` compares before
    the rename into the snapshot; `_cache_hit` hashes a file that is already there), all in
    modelscope_hub/_download.py. A file the library renamed into the snapshot is verified.

    config.json, fetched first and alone to be planned, is one GET over the client's session,
    hashed by this fetch as it streams (`_read_config`).
    """

    default_revision = "master"

    def repo_folder(self, options: FetchOptions) -> Path:
        return _library_cache(options) / "models" / layout.repository_name(options.repo)

    def drop_orphans(self, options: FetchOptions) -> None:
        """Nothing: modelscope resumes its `<file>.incomplete` with a Range request."""

    def __init__(self) -> None:
        self._apis: dict[tuple[str | None, str | None], Any] = {}

    def _api(self, options: FetchOptions) -> Any:
        """One HubApi per endpoint and token for the fetch: each new one probes the endpoint for a
        cloud-internal route again before its first download (DownloadManager._detect_region)."""
        from modelscope_hub.api import HubApi

        key = (options.endpoint, options.token)
        if key not in self._apis:
            self._apis[key] = HubApi(endpoint=options.endpoint, token=options.token)
            _probe_route_early(self._apis[key])
        return self._apis[key]

    def _commit(self, options: FetchOptions, revision: str) -> str:
        if is_commit(revision):
            return revision
        # GET /api/v1/models/<repo>/revisions: branches and tags, each with its CommitId
        # (modelscope_hub 0.5, _legacy_api.py, LegacyClient.list_revisions_detail).
        branches, tags = self._api(options).legacy.list_revisions_detail(options.repo, "model")
        named = [entry for entry in (*branches, *tags) if entry.get("Revision") == revision]
        if not named:
            from modelscope_hub import errors

            raise errors.NotExistError(f"revision {revision} not found")
        return check_commit(named[0].get("CommitId"))

    def resolve(self, options: FetchOptions) -> Listing:
        commit = self._commit(options, options.revision or self.default_revision)
        files = [
            RemoteFile(f.path, int(f.size), f.sha256, None)
            for f in self._api(options).list_repo_files(options.repo, "model", revision=commit, recursive=True)
            if not f.is_dir
        ]
        return Listing(commit, tuple(files))

    def verification(self, listing: Listing) -> Verification:
        seam = _modelscope_listing_seam()
        if seam is not None:
            _log(f"{seam}: every file is hashed from disk, each as soon as it is downloaded")
        return Verification(listing, by_client=seam is None)

    def download(
        self, options: FetchOptions, listing: Listing, names: Sequence[str], verification: Verification
    ) -> Path:
        if verification.by_client and list(names) == [CONFIG_FILE] and verification.remote(CONFIG_FILE).sha256:
            try:  # config.json first, alone
                return self._read_config(options, listing, verification)
            except (BodyMismatch, _BodyTooLong):
                raise
            except Exception as exc:  # the library's download, with its retries, says what fails
                _log(f"{_name(options)}: {CONFIG_FILE} alone failed ({type(exc).__name__}); the library fetches it")
                verification.reset(CONFIG_FILE)
        if verification.by_client:
            wanted = set(names)
            files = [
                {"Path": f.path, "Type": "blob", "Size": f.size, "Sha256": f.sha256}
                for f in listing.files
                if f.path in wanted
            ]
            folder = self._api(options).download_repo(
                options.repo, "model", revision=listing.commit, cache_dir=str(_library_cache(options)), file_list=files
            )
            return Path(folder)
        # Without that seam: the library's compat download, which lists the files again itself. (modelscope
        # >= 1.40 is a shim over modelscope_hub; its package import pulls in torch, which an init container
        # has no use for. The same download function, without that.)
        from modelscope_hub.compat.snapshot_download import snapshot_download

        return Path(
            snapshot_download(
                repo_id=options.repo,
                revision=listing.commit,
                cache_dir=str(_library_cache(options)),
                allow_patterns=[as_name(name) for name in names],
                endpoint=options.endpoint,
                token=options.token,
            )
        )

    def _read_config(self, options: FetchOptions, listing: Listing, verification: Verification) -> Path:
        """config.json alone, over the client's session: its body hashed as it streams, stopped past the
        listed size (`_BodyTooLong`), and renamed into the snapshot only when it matches the listing
        (BodyMismatch: fetched again once); a body that ends short goes to the library. A 1-file
        `download_file` sets up per-file locks, folders and a resumable stream first: 2-3 ms here
        against about 1 for this request, all of it before the first weight byte."""
        snapshot = self.repo_folder(options) / "snapshots" / listing.commit
        snapshot.mkdir(parents=True, exist_ok=True)
        landing = snapshot / f".{CONFIG_FILE}.{os.getpid()}.incomplete"
        stream = verification.body(CONFIG_FILE, 0)
        assert stream is not None  # the listing has its sha256 (`download`)
        # GET /api/v1/models/<repo>/repo?Revision=<commit>&FilePath=config.json, with the client's session
        # and token; an error status raises the client's errors (modelscope_hub 0.5, _legacy_api.py,
        # LegacyClient.download_stream).
        body = self._api(options).legacy.download_stream(options.repo, "model", CONFIG_FILE, listing.commit)
        try:
            size = stream.remote.size
            with body, open(landing, "wb") as out:
                for chunk in body.iter_content(_CONFIG_CHUNK):
                    if stream.position + len(chunk) > size:
                        raise _BodyTooLong(f"{CONFIG_FILE}: the endpoint sent more bytes than the {size} listed")
                    stream.update(chunk)
                    out.write(chunk)
            if stream.position < size:
                raise ConnectionError(f"{CONFIG_FILE}: the body ended after {stream.position} of {size} bytes")
            verification.ended(CONFIG_FILE, stream)  # BodyMismatch when it hashes to another digest
            os.replace(landing, snapshot / CONFIG_FILE)
        finally:
            landing.unlink(missing_ok=True)
        return snapshot

    def verified_by_download(
        self, options: FetchOptions, snapshot: Path, remote: RemoteFile, verification: Verification
    ) -> str | None:
        """When the snapshot holds the file as a regular file of the listed size: STREAMED when this fetch
        hashed its body as it streamed (config.json, `_read_config`), BY_CLIENT when the library had this
        listing's sha256 and size for it (see the class)."""
        if not verification.by_client or remote.sha1 is not None:
            return None
        entry = snapshot / remote.path
        try:
            if entry.is_symlink() or not entry.is_file() or entry.stat().st_size != remote.size:
                return None
        except OSError:
            return None
        return STREAMED if verification.streamed(remote.path) else BY_CLIENT

    def measure(self, folder: Path, listing: Listing, verification: Verification) -> tuple[int, int]:
        return measure(folder, listing)

    def classify(self, exc: BaseException) -> FetchError | None:
        from modelscope_hub import errors

        causes = list(_chain(exc))
        for failed in causes:  # a snapshot download raises one error listing each file's
            if isinstance(failed, errors.FileDownloadError):
                causes += failed.failed_files.values()
        for cause in causes:
            if isinstance(cause, errors.AuthenticationError | errors.PermissionDeniedError):
                return FetchError(ACCESS_DENIED, "the hub refused access; check the token's Secret")
            if isinstance(cause, errors.NotExistError):
                return FetchError(NOT_FOUND, "repository or revision not found")
            if isinstance(cause, errors.FileIntegrityError):
                return FetchError(HASH_MISMATCH, "size or hash differs from the hub's: " + str(cause).splitlines()[0])
        return None


# The modelscope_hub versions whose download (HubApi.download_repo with file_list, and the
# DownloadManager functions the class names) was read: 0.5 and later 0.x.
_MS_CHECKED: Final = (0, 5)


def _probe_route_early(api: Any) -> None:
    """Starts the route probe a modelscope_hub client makes once, before its first download, as the client
    is made: beside this fetch's revision lookup and listing instead of after them. The probe asks the
    endpoint whether it offers a cloud-internal route (`DownloadManager._detect_region`: GET
    <endpoint>/api/v1/repos/internalAccelerationInfo, then the region query address it names, 0.2 s
    timeout each; modelscope_hub 0.5, _download.py); it runs once per client under a lock, so the
    downloads find its answer. A query address the node cannot reach waits out its timeout here,
    beside the listing, instead of before the first byte. A client without it is left as it is."""
    detect = getattr(getattr(api, "downloader", None), "_detect_region", None)
    if not callable(detect):
        return

    def probe() -> None:
        with contextlib.suppress(Exception):  # the first download probes again, and reports what fails
            detect()

    threading.Thread(target=probe, name="fetch-route-probe", daemon=True).start()


def _modelscope_listing_seam() -> str | None:
    """None when modelscope_hub verifies the files against a listing this fetch hands it; else why not."""
    import inspect

    import modelscope_hub
    from modelscope_hub.api import HubApi

    version = str(getattr(modelscope_hub, "__version__", "?"))
    parts = version.split(".")
    numbers = tuple(int(p) for p in parts[:2] if p.isdigit())
    if len(numbers) != 2 or numbers < _MS_CHECKED or numbers[0] != _MS_CHECKED[0]:
        return f"modelscope_hub {version} is not a version whose download was checked (0.5 to 0.x)"
    download_repo = getattr(HubApi, "download_repo", None)
    if download_repo is None or "file_list" not in inspect.signature(download_repo).parameters:
        return f"modelscope_hub {version} has no HubApi.download_repo(file_list=...)"
    download_file = getattr(HubApi, "download_file", None)
    needs = {"expected_sha256", "file_size"}
    if download_file is None or not needs <= set(inspect.signature(download_file).parameters):
        return f"modelscope_hub {version} has no HubApi.download_file(expected_sha256=..., file_size=...)"
    return None


def _library_cache(options: FetchOptions) -> Path:
    return layout.library_cache(options.cache, options.hub, options.endpoint)


def hub_for(name: str) -> Hub:
    if name == HUGGING_FACE:
        return HuggingFaceHub()
    if name == MODEL_SCOPE:
        return ModelScopeHub()
    raise ValueError(f"--hub: {name!r} is not one of {', '.join(HUBS)}")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# --- the fetch ------------------------------------------------------------------------------------


def selected(listing: Listing, allow: Sequence[str], ignore: Sequence[str]) -> Listing:
    """The files the patterns select (fnmatch, as both libraries match them)."""

    def wanted(path: str) -> bool:
        return (not allow or any(fnmatch.fnmatch(path, p) for p in allow)) and not any(
            fnmatch.fnmatch(path, p) for p in ignore
        )

    return Listing(listing.commit, tuple(f for f in listing.files if wanted(f.path)))


def fetch(options: FetchOptions, hub: Hub, progress: Progress, *, on_config: OnConfig | None = None) -> Path:
    """The snapshot directory of the revision, downloaded (once, under the lock) and checked."""
    import filelock

    try:
        check_repository(options.repo)
        if options.revision is not None:
            check_revision(options.revision)
    except ListingError as exc:
        raise FetchError(failures.INVALID_CONFIGURATION, str(exc)) from None
    try:
        listing = checked(selected(hub.resolve(options), options.allow, options.ignore))
    except Exception as exc:
        raise _failure(hub, exc, options) from exc
    if not listing.files:
        raise FetchError(NOT_FOUND, f"{_name(options)}: no files match the allow/ignore patterns")
    progress.revision, progress.files_total, progress.bytes_total = (
        listing.commit,
        len(listing.files),
        listing.total_bytes,
    )
    folder = hub.repo_folder(options)
    marker = folder / ".npu-complete" / f"{listing.commit}.json"
    lock_path = layout.lock_file(options.cache, options.hub, options.endpoint, options.repo)
    progress_file = layout.progress_file(options.cache, options.hub, options.endpoint, options.repo, listing.commit)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_path))
    progress.phase = "Waiting"
    _wait_for(lock, progress, progress_file, options)
    try:
        snapshot = folder / "snapshots" / listing.commit
        if _complete(marker, snapshot, folder, listing):
            _finish(progress, listing)
            return snapshot
        if changed := _rewritten(marker, listing):
            raise FetchError(
                HASH_MISMATCH,
                f"{_name(options)}: the hub now lists other bytes under commit {listing.commit} than the"
                f" snapshot that already holds it ({', '.join(changed[:5])}); a commit names its bytes, so the"
                " snapshot is left as it is and nothing is downloaded",
            )
        marker.unlink(missing_ok=True)
        progress.phase = "Downloading"
        hub.drop_orphans(options)
        verification = hub.verification(listing)
        try:
            with _watch(progress, hub, folder, listing, verification, progress_file):
                snapshot = _download_verified(hub, options, listing, verification, progress, on_config)
                _prune(snapshot, listing)
        finally:
            _BODIES.forget(verification)
        marker.parent.mkdir(parents=True, exist_ok=True)
        _write_json(marker, {"commit": listing.commit, "files": [dataclasses.asdict(f) for f in listing.files]})
        _finish(progress, listing)
        _write_json(progress_file, progress.to_dict())
        return snapshot
    finally:
        lock.release()


def _wait_for(lock: Any, progress: Progress, progress_file: Path, options: FetchOptions) -> None:
    """Takes the repository's lock; meanwhile shows the holder's progress, and gives up when that
    progress has not moved for `options.lock_timeout` seconds (a holder that hangs)."""
    import filelock

    last, since = None, time.monotonic()
    while True:
        try:
            lock.acquire(timeout=1)
            return
        except filelock.Timeout:  # another replica downloads: show its progress
            _adopt(progress, progress_file)
            seen = (progress.bytes_done, progress.files_done)
            if seen != last:
                last, since = seen, time.monotonic()
            elif time.monotonic() - since > options.lock_timeout:
                raise FetchError(
                    DOWNLOAD_FAILED,
                    f"{_name(options)}: another download of the repository holds the cache's lock and has not"
                    f" progressed for {options.lock_timeout:.0f}s",
                ) from None


def _download_verified(
    hub: Hub,
    options: FetchOptions,
    listing: Listing,
    verification: Verification,
    progress: Progress,
    on_config: OnConfig | None,
) -> Path:
    """The library's download of the listed files, each verified (config.json first, verified, and
    planned, when it is to be planned)."""
    names = sorted(f.path for f in listing.files)
    if on_config is not None and CONFIG_FILE in names:
        on_config(_download_and_check(hub, options, listing, [CONFIG_FILE], verification, progress))
        progress.phase = "Downloading"
    return _download_and_check(hub, options, listing, names, verification, progress)


def _download_and_check(
    hub: Hub,
    options: FetchOptions,
    listing: Listing,
    names: Sequence[str],
    verification: Verification,
    progress: Progress,
) -> Path:
    """Downloads `names` with the library and verifies each: while it streamed, by the hub's client, or
    else from disk now (`verify` says which applies when). The library is not asked again for a file
    this fetch verified already (config.json, fetched first), but every file is checked after it. A
    file that does not match is fetched again once (a cut or a corrupt proxy answer); twice wrong is
    the hub's: ModelHashMismatch."""
    wanted = set(names)
    files = [f for f in listing.files if f.path in wanted]
    snapshot = hub.repo_folder(options) / "snapshots" / listing.commit
    bad: list[str] = []
    for _attempt in range(2):
        asked = [f.path for f in files if not verification.still_verified(f.path, identity(snapshot / f.path))]
        try:
            with _hash_as_they_land(snapshot, files, verification):
                if asked:
                    snapshot = _inside_cache(hub, hub.download(options, listing, asked, verification), options, listing)
        except FetchError:
            raise
        except Exception as exc:
            bad = verification.failed()  # caught while streaming, before the library kept the body
            if not bad or not any(isinstance(cause, BodyMismatch) for cause in _chain(exc)):
                raise _failure(hub, exc, options) from exc
        else:
            bad = _check(hub, options, snapshot, files, verification, progress)
        if not bad:
            return snapshot
        for path in bad:
            _remove(snapshot, path)
            verification.reset(path)
    raise FetchError(HASH_MISMATCH, f"{_name(options)}: size or hash differs from the hub's: {bad}")


def _check(
    hub: Hub,
    options: FetchOptions,
    snapshot: Path,
    files: Sequence[RemoteFile],
    verification: Verification,
    progress: Progress,
) -> list[str]:
    """The files of `files` that do not match. A file verified before counts while its snapshot entry
    still leads to the same file (another file's download may have replaced a blob they share, or a
    retry removed it); the others count when the download verified them, else they are hashed from
    disk now."""
    later: list[RemoteFile] = []
    for remote in files:
        found = identity(snapshot / remote.path)
        if verification.still_verified(remote.path, found):
            continue
        verification.unmark(remote.path)
        how = hub.verified_by_download(options, snapshot, remote, verification)
        if how is not None and found is not None:
            verification.mark(remote.path, how, found)
        else:
            later.append(remote)
    if not later:
        return []
    lost = verification.lost()
    reasons = sorted({lost[f.path] for f in later if f.path in lost})
    _log(
        f"{_name(options)}: {len(later)} of {len(files)} files ({sum(f.size for f in later)} bytes) hashed after the"
        f" download{': ' + '; '.join(reasons) if reasons else ''}"
    )
    progress.phase = "Verifying"
    return _hash_from_disk(snapshot, later, verification)


def _inside_cache(hub: Hub, snapshot: Path, options: FetchOptions, listing: Listing) -> Path:
    """The library's snapshot directory, when it is the one this fetch expects."""
    expected = hub.repo_folder(options) / "snapshots" / listing.commit
    if os.path.realpath(snapshot) != os.path.realpath(expected):
        raise FetchError(DOWNLOAD_FAILED, f"{_name(options)}: the library put the snapshot at {snapshot}")
    return expected


def _finish(progress: Progress, listing: Listing) -> None:
    progress.phase = "Ready"
    progress.bytes_done = progress.bytes_total = listing.total_bytes
    progress.files_done = progress.files_total = len(listing.files)


def _complete(marker: Path, snapshot: Path, folder: Path, listing: Listing) -> bool:
    """The marker matches the listing, and every file is still there with its size, inside the
    repository's folder (a marker alone proves nothing once blobs were deleted or replaced)."""
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if recorded.get("files") != [dataclasses.asdict(f) for f in listing.files]:
        return False
    root = os.path.realpath(folder)
    for remote in listing.files:
        path = os.path.realpath(snapshot / remote.path)
        if not path.startswith(root + os.sep) or not os.path.isfile(path) or os.path.getsize(path) != remote.size:
            return False
    return not _extras(snapshot, listing)


def _rewritten(marker: Path, listing: Listing) -> list[str]:
    """The paths whose size or hash the hub lists differently from what a finished fetch of the same
    commit recorded in `marker` (none without a readable marker). A commit names its bytes: a hub that
    answers other bytes under it is wrong or hostile, and a running replica links that snapshot, so
    it is never rewritten for a commit it already holds (files the record does not name may be added)."""
    try:
        recorded = json.loads(marker.read_text())
        held = {f["path"]: (f["size"], f["sha256"], f["sha1"]) for f in recorded["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return sorted(f.path for f in listing.files if f.path in held and held[f.path] != (f.size, f.sha256, f.sha1))


@contextlib.contextmanager
def _hash_as_they_land(snapshot: Path, files: Sequence[RemoteFile], verification: Verification) -> Iterator[None]:
    """While the library downloads: hashes from disk each file that is complete in the snapshot and that
    nothing verified as it arrived (already in the cache, fetched by hf_xet, a body that could not be
    hashed, a client without the seams), so that after the library returns only the last ones to land
    remain for `_check`. Nothing is concluded from a mismatch here: `_check` decides."""
    if verification.by_client:
        yield  # the client verifies every file it puts in the snapshot
        return
    stop = threading.Event()
    tried: dict[str, Identity] = {}

    def candidates() -> Iterator[RemoteFile]:
        for remote in files:
            if stop.is_set():
                return
            if verification.settled(remote.path):
                continue
            found = identity(snapshot / remote.path)
            if found is not None and found[2] == remote.size and tried.get(remote.path) != found:
                tried[remote.path] = found
                yield remote

    def loop() -> None:
        pause = 0.5
        while not stop.wait(pause):
            started = time.monotonic()
            for remote in candidates():
                _hash_one(snapshot, remote, verification)
            pause = max(0.5, 10 * (time.monotonic() - started))  # a scan of many files: less often

    thread = threading.Thread(target=loop, name="fetch-hash-landed", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _hash_from_disk(snapshot: Path, files: Sequence[RemoteFile], verification: Verification) -> list[str]:
    """The files whose size or hash on disk differs, checked in parallel (hashlib releases the GIL);
    the others are marked verified."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        matches = list(pool.map(lambda remote: _hash_one(snapshot, remote, verification), files))
    return [f.path for f, ok in zip(files, matches, strict=True) if not ok]


def _hash_one(snapshot: Path, remote: RemoteFile, verification: Verification) -> bool:
    """Whether the file on disk matches; marked verified (with what its entry leads to) when it does."""
    entry = snapshot / check_path(remote.path)
    before = identity(entry)
    ok = before is not None and file_matches(entry, remote) and identity(entry) == before
    if ok and before is not None:
        verification.mark(remote.path, FROM_DISK, before)
    return ok


def file_matches(path: Path, remote: RemoteFile) -> bool:
    """Whether the file on disk has the hub's size and hash."""
    try:
        if path.stat().st_size != remote.size:
            return False
        digest = new_hash(remote)
        if digest is None:
            return True
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return False
    return bool(digest.hexdigest() == expected_digest(remote))


def _extras(snapshot: Path, listing: Listing) -> list[str]:
    """Entries of the snapshot (files, links) that the listing does not name."""
    names = {f.path for f in listing.files}
    found: list[str] = []
    for root, dirs, files in os.walk(snapshot):  # never follows a link to a directory
        relative = os.path.relpath(root, snapshot)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = name if relative == "." else f"{relative}/{name}"
            if path not in names:
                found.append(path)
    return sorted(found)


def _prune(snapshot: Path, listing: Listing) -> None:
    """Removes what the listing does not name: a snapshot holds the verified files and nothing else."""
    for path in _extras(snapshot, listing):
        with contextlib.suppress(OSError):
            (snapshot / path).unlink()


def _remove(snapshot: Path, path: str) -> None:
    """A file of a snapshot, and the blob it links to (Hugging Face's cache) when that is inside the
    repository's folder; nothing outside it is ever deleted."""
    target = snapshot / check_path(path)
    repository = os.path.realpath(snapshot.parent.parent)
    with contextlib.suppress(OSError):
        if not os.path.realpath(target.parent).startswith(repository + os.sep):
            return
        if target.is_symlink() and os.path.realpath(target).startswith(repository + os.sep):
            os.unlink(os.path.realpath(target))
        target.unlink(missing_ok=True)


def _remove_tree(path: Path, within: Path) -> None:
    import shutil

    if path.is_dir() and not path.is_symlink() and os.path.realpath(path).startswith(os.path.realpath(within)):
        shutil.rmtree(path, ignore_errors=True)


def _failure(hub: Hub, exc: BaseException, options: FetchOptions) -> FetchError:
    if isinstance(exc, FetchError):
        return exc
    for cause in _chain(exc):
        if isinstance(cause, ListingError):
            return FetchError(DOWNLOAD_FAILED, f"{_name(options)}: refused the hub's answer: {cause}")
        if isinstance(cause, _BodyTooLong):
            return FetchError(HASH_MISMATCH, f"{_name(options)}: {cause}")
    if any(isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT) for cause in _chain(exc)):
        return FetchError(CACHE_FULL, f"{_name(options)}: no space left on the cache volume")
    found = hub.classify(exc)
    if found is not None:
        return FetchError(found.reason, f"{_name(options)}: {found.message}")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return FetchError(DOWNLOAD_FAILED, f"{_name(options)}: {type(exc).__name__}: {first}")


def _name(options: FetchOptions) -> str:
    return f"{options.hub} {options.repo}@{options.revision or hub_for(options.hub).default_revision}"


# --- progress -------------------------------------------------------------------------------------


def measure(folder: Path, listing: Listing) -> tuple[int, int]:
    """(bytes, files) of the revision on disk, as ModelScope's progress: complete files in its snapshot
    (modelscope_hub renames a file there only once its sha256 matched) plus its partial
    `*.incomplete` files (it hashes each chunk as it writes it, and a resumed prefix first)."""
    snapshot = folder / "snapshots" / listing.commit
    done_bytes = done_files = 0
    for remote in listing.files:
        with contextlib.suppress(OSError):
            if (snapshot / remote.path).stat().st_size == remote.size:
                done_bytes += remote.size
                done_files += 1
    for root, _dirs, names in os.walk(folder):
        for name in names:
            if name.endswith(".incomplete"):
                with contextlib.suppress(OSError):
                    done_bytes += os.lstat(os.path.join(root, name)).st_size
    return min(done_bytes, listing.total_bytes), done_files


@contextlib.contextmanager
def _watch(
    progress: Progress, hub: Hub, folder: Path, listing: Listing, verification: Verification, progress_file: Path
) -> Iterator[None]:
    """Measures the verified bytes (`Hub.measure`) and writes the progress file, each second while the library works."""
    stop = threading.Event()

    def tick() -> None:
        progress.bytes_done, progress.files_done = hub.measure(folder, listing, verification)
        _write_json(progress_file, progress.to_dict())

    def loop() -> None:
        while not stop.wait(1.0):
            tick()

    tick()
    thread = threading.Thread(target=loop, name="fetch-progress", daemon=True)
    thread.start()
    finished = False
    try:
        yield
        finished = True
    finally:
        stop.set()
        thread.join()
        if not finished:
            tick()  # what a download that failed had verified (a fetch that succeeds writes its end itself)


def _adopt(progress: Progress, progress_file: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        theirs = json.loads(progress_file.read_text())
        progress.bytes_done = int(theirs.get("bytesDone", progress.bytes_done))
        progress.files_done = int(theirs.get("filesDone", progress.files_done))


def _write_json(path: Path, payload: Any) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True))
    os.replace(tmp, path)


class StatusServer:
    """`/status` -> {"model": progress}: what the operator reads while the init container runs."""

    def __init__(self, progress: Progress, port: int, host: str = "0.0.0.0") -> None:
        shown = progress

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/status", "/healthz"):
                    self.send_error(404)
                    return
                body = json.dumps({"state": "fetching", "model": shown.to_dict()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fetch-status", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- command line ---------------------------------------------------------------------------------


def fetch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu-runtime fetch",
        description="Download a model repository into the shared cache (once per revision) and link it.",
    )
    parser.add_argument("--hub", required=True, choices=HUBS)
    parser.add_argument("--repo", required=True, help="repository id, e.g. Qwen/Qwen2.5-7B-Instruct")
    parser.add_argument("--revision", help="branch, tag or commit (default: the hub's main branch)")
    parser.add_argument("--cache", required=True, type=Path, help="the cache volume's mount path")
    parser.add_argument("--allow", action="append", default=[], metavar="PATTERN", help="only matching files")
    parser.add_argument("--ignore", action="append", default=[], metavar="PATTERN", help="skip matching files")
    parser.add_argument("--endpoint", help="the hub's URL (a mirror); default: the library's")
    parser.add_argument(
        "--send-token-over-http",
        action="store_true",
        help="hand the token to a plain http:// endpoint too (by default only https:// endpoints get it)",
    )
    parser.add_argument("--link", type=Path, help="make this path a symlink to the snapshot directory")
    parser.add_argument("--status-port", type=int, help="serve /status with the progress on this port")
    parser.add_argument("--status-host", default="0.0.0.0", help="the address the status port listens on")
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=DEFAULT_LOCK_TIMEOUT,
        metavar="SECONDS",
        help="give up waiting for another download of the repository after this long without its progress moving",
    )
    parser.add_argument(
        "--hold",
        action="store_true",
        help="after the fetch, keep serving /status and never exit: a pod that only resolves the branch of a "
        "rollout (the operator pins the commit it reports, then replaces the pod)",
    )
    parser.add_argument("--termination-message-path", default=DEFAULT_TERMINATION_LOG)
    parser.add_argument(
        "--plan",
        nargs=argparse.REMAINDER,
        help="after config.json arrives, run `npu-runtime plan` with these flags; stop if the model cannot fit",
    )
    return parser


def fetch_command(argv: list[str]) -> int:
    args = fetch_parser().parse_args(argv)
    options = FetchOptions(
        hub=args.hub,
        repo=args.repo,
        revision=args.revision,
        cache=args.cache,
        allow=tuple(args.allow),
        ignore=tuple(args.ignore),
        endpoint=args.endpoint,
        token=os.environ.get(TOKEN_ENV) or None,
        link=args.link,
        lock_timeout=args.lock_timeout,
    )
    progress = Progress(source=args.hub, repository=args.repo, revision=args.revision)
    plain = options.endpoint is not None and not options.endpoint.startswith("https://")
    if options.token and plain and not args.send_token_over_http:
        message = f"--endpoint {options.endpoint} is not https://; the token is not sent in clear text"
        write_termination_message(
            Failure(failures.INVALID_CONFIGURATION, message),
            args.termination_message_path,
            default_path=DEFAULT_TERMINATION_LOG,
        )
        return EXIT_INVALID
    server = StatusServer(progress, args.status_port, args.status_host) if args.status_port else None
    started = time.monotonic()
    try:
        hub = hub_for(options.hub)
        on_config = _planner(args.plan) if args.plan is not None else None
        snapshot = fetch(options, hub, progress, on_config=on_config)
        if options.link is not None:
            link_snapshot(options.link, snapshot)
    except FetchError as exc:
        progress.phase, progress.reason, progress.message = "Failed", exc.reason, exc.message
        write_termination_message(
            Failure(exc.reason, exc.message), args.termination_message_path, default_path=DEFAULT_TERMINATION_LOG
        )
        return EXIT_CODES.get(exc.reason, EXIT_FAILED)
    finally:
        if server is not None and not args.hold:
            server.close()
    seconds = time.monotonic() - started
    print(
        f"npu-runtime fetch: {options.repo}@{progress.revision}: {progress.files_total} files, "
        f"{progress.bytes_total} bytes ready in {seconds:.1f}s at {snapshot}",
        flush=True,
    )
    # The kubelet keeps a finished container's termination message too: the operator learns the
    # resolved revision and the figures from it even when the download took less than a poll.
    _write_result(args.termination_message_path, progress)
    if args.hold:
        # The serving container must not start on a commit only this pod resolved: /status says which
        # commit it is, the operator pins it into the pod template, and the pod is replaced (SIGTERM).
        print(
            f"npu-runtime fetch: holding until the pod is replaced (the rollout pins {progress.revision})", flush=True
        )
        while True:
            time.sleep(3600)
    return EXIT_OK


def _write_result(path: str, progress: Progress) -> None:
    target = Path(path)
    if path == DEFAULT_TERMINATION_LOG and not target.exists():
        return
    with contextlib.suppress(OSError):
        target.write_text(f"{READY}: {json.dumps(progress.to_dict(), sort_keys=True)}\n", encoding="utf-8")


def link_snapshot(link: Path, snapshot: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(link.name + ".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(snapshot.resolve() if not snapshot.is_absolute() else snapshot, target_is_directory=True)
    os.replace(tmp, link)


def _planner(flags: list[str]) -> OnConfig:
    """Called with the snapshot once config.json is there: plans it, and stops the fetch when it cannot fit."""
    flags = flags[1:] if flags and flags[0] == "--" else flags

    def check(snapshot: Path) -> None:
        from npu_runtime.cli import plan_parser, render_plan
        from npu_runtime.contract import option_name, plan_options_from_args
        from npu_runtime.planner.config_fields import ModelError
        from npu_runtime.planner.plan import DoesNotFitError, PlanError, plan_for

        args = plan_parser().parse_args(["--model", str(snapshot / CONFIG_FILE), *flags])
        try:
            plan = plan_for(plan_options_from_args(args), args.model)
        except DoesNotFitError as exc:
            raise FetchError(failures.MODEL_DOES_NOT_FIT, f"planned from config.json: {exc}") from exc
        except PlanError as exc:
            raise FetchError(failures.INVALID_CONFIGURATION, f"{option_name(exc.field)}: {exc.message}") from exc
        except ModelError as exc:
            raise FetchError(failures.MODEL_INVALID, f"config.json: {exc}") from exc
        print(render_plan(plan.to_dict()), flush=True)

    return check
