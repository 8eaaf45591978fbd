"""The fetch itself: a revision's files into the shared cache, once, under the repository's lock, each verified."""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from npu_runtime.fetch import layout
from npu_runtime.fetch.bodies import EXPECTED_BODIES, BodyTooLong
from npu_runtime.fetch.disk import extras, hash_as_they_land, hash_from_disk, prune, remove
from npu_runtime.fetch.hub import (
    CACHE_FULL,
    CONFIG_FILE,
    DOWNLOAD_FAILED,
    HASH_MISMATCH,
    NOT_FOUND,
    FetchError,
    FetchOptions,
    Hub,
    causes,
    fetch_label,
    log,
)
from npu_runtime.fetch.listing import (
    Listing,
    ListingError,
    RemoteFile,
    check_repository,
    check_revision,
    checked,
)
from npu_runtime.fetch.progress import Progress, adopt, watch, write_json
from npu_runtime.fetch.verify import BodyMismatch, Verification, identity
from npu_runtime.serving import failures

OnConfig = Callable[[Path], None]  # called with the snapshot directory once config.json is in it


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
        raise FetchError(NOT_FOUND, f"{fetch_label(options)}: no files match the allow/ignore patterns")
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
                f"{fetch_label(options)}: the hub now lists other bytes under commit {listing.commit} than the"
                f" snapshot that already holds it ({', '.join(changed[:5])}); a commit names its bytes, so the"
                " snapshot is left as it is and nothing is downloaded",
            )
        marker.unlink(missing_ok=True)
        progress.phase = "Downloading"
        hub.drop_orphans(options)
        verification = hub.verification(listing)
        try:
            with watch(progress, hub, folder, listing, verification, progress_file):
                snapshot = _download_verified(hub, options, listing, verification, progress, on_config)
                prune(snapshot, listing)
        finally:
            EXPECTED_BODIES.forget(verification)
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_json(marker, {"commit": listing.commit, "files": [dataclasses.asdict(f) for f in listing.files]})
        _finish(progress, listing)
        write_json(progress_file, progress.to_dict())
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
            adopt(progress, progress_file)
            seen = (progress.bytes_done, progress.files_done)
            if seen != last:
                last, since = seen, time.monotonic()
            elif time.monotonic() - since > options.lock_timeout:
                raise FetchError(
                    DOWNLOAD_FAILED,
                    f"{fetch_label(options)}: another download of the repository holds the cache's lock and has not"
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
            with hash_as_they_land(snapshot, files, verification):
                if asked:
                    snapshot = _inside_cache(hub, hub.download(options, listing, asked, verification), options, listing)
        except FetchError:
            raise
        except Exception as exc:
            bad = verification.failed()  # caught while streaming, before the library kept the body
            if not bad or not any(isinstance(cause, BodyMismatch) for cause in causes(exc)):
                raise _failure(hub, exc, options) from exc
        else:
            bad = _check(hub, options, snapshot, files, verification, progress)
        if not bad:
            return snapshot
        for path in bad:
            remove(snapshot, path)
            verification.reset(path)
    raise FetchError(HASH_MISMATCH, f"{fetch_label(options)}: size or hash differs from the hub's: {bad}")


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
    log(
        f"{fetch_label(options)}: {len(later)} of {len(files)} files ({sum(f.size for f in later)} bytes) hashed"
        f" after the download{': ' + '; '.join(reasons) if reasons else ''}"
    )
    progress.phase = "Verifying"
    return hash_from_disk(snapshot, later, verification)


def _inside_cache(hub: Hub, snapshot: Path, options: FetchOptions, listing: Listing) -> Path:
    """The library's snapshot directory, when it is the one this fetch expects."""
    expected = hub.repo_folder(options) / "snapshots" / listing.commit
    if os.path.realpath(snapshot) != os.path.realpath(expected):
        raise FetchError(DOWNLOAD_FAILED, f"{fetch_label(options)}: the library put the snapshot at {snapshot}")
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
    return not extras(snapshot, listing)


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


def _failure(hub: Hub, exc: BaseException, options: FetchOptions) -> FetchError:
    if isinstance(exc, FetchError):
        return exc
    for cause in causes(exc):
        if isinstance(cause, ListingError):
            return FetchError(DOWNLOAD_FAILED, f"{fetch_label(options)}: refused the hub's answer: {cause}")
        if isinstance(cause, BodyTooLong):
            return FetchError(HASH_MISMATCH, f"{fetch_label(options)}: {cause}")
    if any(isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT) for cause in causes(exc)):
        return FetchError(CACHE_FULL, f"{fetch_label(options)}: no space left on the cache volume")
    found = hub.classify(exc)
    if found is not None:
        return FetchError(found.reason, f"{fetch_label(options)}: {found.message}")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return FetchError(DOWNLOAD_FAILED, f"{fetch_label(options)}: {type(exc).__name__}: {first}")
