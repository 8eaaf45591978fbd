"""`npu-runtime fetch`: a model repository from Hugging Face or ModelScope into the shared cache, once.

Runs as the pod's init container (the runtime image), before `npu-runtime serve`:

    npu-runtime fetch --hub huggingface --repo Qwen/Qwen2.5-7B-Instruct [--revision REV] \
        --cache /models [--allow PATTERN]... [--ignore PATTERN]... [--endpoint URL] --link /run/npu-model/model

The download itself is the hub's own client library (`huggingface_hub.snapshot_download`,
`modelscope.snapshot_download`): their cache layout, their resume with HTTP Range (both within a
process; modelscope also across processes, huggingface_hub 1.x never reuses a killed process's
partial file, which the next holder of the lock removes), their retries. This module adds what a
shared cache volume needs around them:

- **One download per revision.** The revision is first resolved with the hub (Hugging Face: to
  its commit), then a file lock on the cache volume, `<cache>/.npu/locks/<hub>/<repo>/<key>.lock`,
  is taken. The first replica downloads; the others wait on the lock (showing the holder's
  progress, which it writes beside the lock) and find the revision complete. A lock, not a Job
  per revision: no extra controller, objects or RBAC, and it works for every resource and
  replica that mounts the same volume, across namespaces' PVCs that bind one volume. The
  kernel drops the lock when its holder dies, so a killed pod never blocks the next one,
  which takes the download over.
- **Complete means checked.** After the library returns, every file's size and hash is checked
  against the hub's listing (sha256 for LFS files and every ModelScope file, the git blob sha1
  for the rest). A file that does not match is deleted and fetched again once; twice wrong is
  `ModelHashMismatch`. Only then is the marker `<repo folder>/.npu-complete/<key>.json` written,
  and later pods trust the marker when the hub's listing still matches it.
- **config.json first**, so the model can be planned (`--plan` runs `npu-runtime plan` with
  the given flags) before gigabytes of weights arrive: a model that cannot fit fails in seconds.
- **Progress** (`--status-port`): `/status` answers `{"model": {...}}` with the phase, bytes
  done/total and files, which the operator folds into `status.model`.
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
import hashlib
import http.server
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from npu_runtime.serving import failures
from npu_runtime.serving.failures import Failure, write_termination_message

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


OnConfig = Callable[[Path], None]  # called with the snapshot directory once config.json is in it


class FetchError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None
    sha1: str | None  # git blob id, where the hub gives no sha256


@dataclasses.dataclass(frozen=True)
class Listing:
    """A revision as the hub lists it: the commit it resolves to (or the name, where the hub has none)."""

    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


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
    def download(self, options: FetchOptions, commit: str, allow: Sequence[str] | None) -> Path: ...
    def classify(self, exc: BaseException) -> FetchError | None: ...


class HuggingFaceHub:
    """`huggingface_hub`: its standard cache (`models--org--name/{blobs,snapshots/<commit>}`) in <cache>/huggingface."""

    default_revision = "main"

    def repo_folder(self, options: FetchOptions) -> Path:
        return options.cache / HUGGING_FACE / ("models--" + options.repo.replace("/", "--"))

    def drop_orphans(self, options: FetchOptions) -> None:
        """Partial files of killed downloads: huggingface_hub 1.x writes to a file unique to the process
        and never reuses it (huggingface_hub#4228), so under our lock nobody else's is in flight."""
        for orphan in (self.repo_folder(options) / "blobs").glob("*.incomplete"):
            orphan.unlink(missing_ok=True)

    def resolve(self, options: FetchOptions) -> Listing:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile as HfRepoFile

        api = HfApi(endpoint=options.endpoint, token=options.token or False)
        revision = options.revision or self.default_revision
        commit = api.repo_info(options.repo, revision=revision).sha or revision
        files = [
            RemoteFile(f.path, f.size, f.lfs.sha256 if f.lfs else None, None if f.lfs else f.blob_id)
            for f in api.list_repo_tree(options.repo, recursive=True, revision=commit)
            if isinstance(f, HfRepoFile)
        ]
        return Listing(commit, tuple(files))

    def download(self, options: FetchOptions, commit: str, allow: Sequence[str] | None) -> Path:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                options.repo,
                revision=commit,
                cache_dir=options.cache / HUGGING_FACE,
                allow_patterns=list(allow) if allow is not None else None,
                ignore_patterns=list(options.ignore) or None,
                endpoint=options.endpoint,
                token=options.token or False,
            )
        )

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


class ModelScopeHub:
    """`modelscope`: its cache (`models/org--name/snapshots/<revision>`) under <cache>/modelscope.

    ModelScope's file API takes a branch, tag or commit but answers no commit for a branch: the
    cache key is the revision as given, and a cached branch is re-checked against the hub's
    current listing (sizes and sha256) at every start.
    """

    default_revision = "master"

    def repo_folder(self, options: FetchOptions) -> Path:
        return options.cache / MODEL_SCOPE / "models" / options.repo.replace("/", "--")

    def drop_orphans(self, options: FetchOptions) -> None:
        """Nothing: modelscope resumes its `<file>.incomplete` with a Range request."""

    def _api(self, options: FetchOptions) -> Any:
        from modelscope_hub.api import HubApi

        return HubApi(endpoint=options.endpoint, token=options.token)

    def resolve(self, options: FetchOptions) -> Listing:
        revision = options.revision or self.default_revision
        files = [
            RemoteFile(f.path, int(f.size), f.sha256, None)
            for f in self._api(options).list_repo_files(options.repo, "model", revision=revision, recursive=True)
            if not f.is_dir
        ]
        return Listing(revision, tuple(files))

    def download(self, options: FetchOptions, commit: str, allow: Sequence[str] | None) -> Path:
        # modelscope >= 1.40 is a shim over modelscope_hub; its package import pulls in torch, which
        # an init container has no use for. The same download function, without that.
        from modelscope_hub.compat.snapshot_download import snapshot_download

        return Path(
            snapshot_download(
                repo_id=options.repo,
                revision=commit,
                cache_dir=str(options.cache / MODEL_SCOPE),
                allow_patterns=list(allow) if allow is not None else None,
                ignore_patterns=list(options.ignore) or None,
                endpoint=options.endpoint,
                token=options.token,
            )
        )

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


def cache_key(listing: Listing) -> str:
    """The file name (without suffix) of a revision's lock, progress and marker files."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", listing.commit)


def fetch(options: FetchOptions, hub: Hub, progress: Progress, *, on_config: OnConfig | None = None) -> Path:
    """The snapshot directory of the revision, downloaded (once, under the lock) and checked."""
    import filelock

    try:
        listing = selected(hub.resolve(options), options.allow, options.ignore)
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
    key = cache_key(listing)
    marker = folder / ".npu-complete" / f"{key}.json"
    state = options.cache / ".npu" / "locks" / options.hub / options.repo / key
    state.parent.mkdir(parents=True, exist_ok=True)
    progress_file = state.with_suffix(".progress.json")
    lock = filelock.FileLock(str(state.with_suffix(".lock")))
    progress.phase = "Waiting"
    while True:
        try:
            lock.acquire(timeout=1)
            break
        except filelock.Timeout:  # another replica downloads: show its progress
            _adopt(progress, progress_file)
    try:
        if _complete(marker, listing):
            snapshot = _snapshot_dir(hub, options, listing)
            _finish(progress, listing)
            return snapshot
        progress.phase = "Downloading"
        hub.drop_orphans(options)
        with _watch(progress, folder, listing, progress_file):
            snapshot = _download(hub, options, listing, on_config)
            progress.phase = "Verifying"
            bad = _mismatched(snapshot, listing)
            if bad:  # fetched again once: a cut or a corrupt proxy answer; twice wrong is the hub's
                for path in bad:
                    _remove(snapshot / path)
                snapshot = _download(hub, options, listing, None)
                if bad := _mismatched(snapshot, listing):
                    raise FetchError(HASH_MISMATCH, f"{_name(options)}: size or hash differs from the hub's: {bad}")
        marker.parent.mkdir(parents=True, exist_ok=True)
        _write_json(marker, {"commit": listing.commit, "files": [dataclasses.asdict(f) for f in listing.files]})
        _finish(progress, listing)
        _write_json(progress_file, progress.to_dict())
        return snapshot
    finally:
        lock.release()


def _download(hub: Hub, options: FetchOptions, listing: Listing, on_config: OnConfig | None) -> Path:
    """The library's download of the listed files (config.json first when it is to be planned)."""
    names = {f.path for f in listing.files}
    try:
        if on_config is not None and CONFIG_FILE in names:
            on_config(hub.download(options, listing.commit, [CONFIG_FILE]))
        return hub.download(options, listing.commit, sorted(names))
    except FetchError:
        raise
    except Exception as exc:
        raise _failure(hub, exc, options) from exc


def _snapshot_dir(hub: Hub, options: FetchOptions, listing: Listing) -> Path:
    return hub.repo_folder(options) / "snapshots" / listing.commit


def _finish(progress: Progress, listing: Listing) -> None:
    progress.phase = "Ready"
    progress.bytes_done = progress.bytes_total = listing.total_bytes
    progress.files_done = progress.files_total = len(listing.files)


def _complete(marker: Path, listing: Listing) -> bool:
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return bool(recorded.get("files") == [dataclasses.asdict(f) for f in listing.files])


def _mismatched(snapshot: Path, listing: Listing) -> list[str]:
    """The files whose size or hash differs, checked in parallel (hashlib releases the GIL)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        matches = list(pool.map(lambda f: file_matches(snapshot / f.path, f), listing.files))
    return [f.path for f, ok in zip(listing.files, matches, strict=True) if not ok]


def file_matches(path: Path, remote: RemoteFile) -> bool:
    """Whether the file on disk has the hub's size and hash."""
    try:
        if path.stat().st_size != remote.size:
            return False
        if remote.sha256:
            digest = hashlib.sha256()
        elif remote.sha1:
            digest = hashlib.sha1(b"blob %d\0" % remote.size)
        else:
            return True
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return False
    return digest.hexdigest() == (remote.sha256 or remote.sha1)


def _remove(path: Path) -> None:
    """A file of a snapshot, and the blob it links to (Hugging Face's cache)."""
    with contextlib.suppress(OSError):
        if path.is_symlink():
            path.resolve().unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def _failure(hub: Hub, exc: BaseException, options: FetchOptions) -> FetchError:
    if isinstance(exc, FetchError):
        return exc
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
    """(bytes, files) of the revision on disk: complete files in its snapshot plus both libraries'
    partial `*.incomplete` files (which is what a resumed download starts from)."""
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
def _watch(progress: Progress, folder: Path, listing: Listing, progress_file: Path) -> Iterator[None]:
    """Measures the revision on disk and writes the progress file, each second while the library works."""
    stop = threading.Event()

    def tick() -> None:
        progress.bytes_done, progress.files_done = measure(folder, listing)
        _write_json(progress_file, progress.to_dict())

    def loop() -> None:
        while not stop.wait(1.0):
            tick()

    tick()
    thread = threading.Thread(target=loop, name="fetch-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        tick()


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
    parser.add_argument("--link", type=Path, help="make this path a symlink to the snapshot directory")
    parser.add_argument("--status-port", type=int, help="serve /status with the progress on this port")
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
    )
    progress = Progress(source=args.hub, repository=args.repo, revision=args.revision)
    server = StatusServer(progress, args.status_port) if args.status_port else None
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
        if server is not None:
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
        from npu_runtime.planner.model import ModelError
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
