"""A snapshot's files on disk: hashed against the listing, and what does not belong removed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from npu_runtime.fetch.listing import Listing, RemoteFile, check_path
from npu_runtime.fetch.verify import FROM_DISK, Identity, Verification, expected_digest, identity, new_hash

_CHUNK: Final = 8 << 20


@contextlib.contextmanager
def hash_as_they_land(snapshot: Path, files: Sequence[RemoteFile], verification: Verification) -> Iterator[None]:
    """While the library downloads: hashes from disk each file that is complete in the snapshot and that
    nothing verified as it arrived (already in the cache, fetched by hf_xet, a body that could not be
    hashed, a client without the seams), so that after the library returns only the last ones to land
    remain for `driver._check`. Nothing is concluded from a mismatch here: `driver._check` decides."""
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


def hash_from_disk(snapshot: Path, files: Sequence[RemoteFile], verification: Verification) -> list[str]:
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


def extras(snapshot: Path, listing: Listing) -> list[str]:
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


def prune(snapshot: Path, listing: Listing) -> None:
    """Removes what the listing does not name: a snapshot holds the verified files and nothing else."""
    for path in extras(snapshot, listing):
        with contextlib.suppress(OSError):
            (snapshot / path).unlink()


def remove(snapshot: Path, path: str) -> None:
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


def remove_tree(path: Path, within: Path) -> None:
    import shutil

    if path.is_dir() and not path.is_symlink() and os.path.realpath(path).startswith(os.path.realpath(within)):
        shutil.rmtree(path, ignore_errors=True)
