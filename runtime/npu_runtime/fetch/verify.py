"""Which files of a fetch are verified, and the hashes that run while their bytes arrive.

A file of the listing is verified when its size and its hash (sha256, or the git blob sha1 where
the hub lists no sha256) match the listing. That is done in one of three ways, the first that
applies:

- **while it streams** (Hugging Face): the fetch's check on huggingface_hub's HTTP client feeds
  every body byte of a listed file into the file's hash as the library reads it (`StreamHash`),
  and compares the digest when the body ends; a body that does not match raises inside the
  library's read, before the library moves the file into its cache, so a wrong body never lands
  there. A body that resumes a cut one with a Range request continues the same hash when it
  starts where the hash is, which is where the library's file ends (`StreamHash`), so the hash
  covers the resumed prefix too.
- **by the hub's client itself** (ModelScope): modelscope_hub hashes each file while it streams
  and compares against the sha256 and size this fetch's listing hands it (`modelscope.py` says
  where), renaming the file into the snapshot only when they match.
- **from disk after the download**, for everything else: a file the library did not stream this
  time (already in the cache), a body that could not be hashed as it came (compressed, resumed
  elsewhere than where its hash was, fetched by a client outside the HTTP check such as hf_xet),
  or a client version whose seams are missing.

`Verification` keeps the state of one fetch: per file, the bytes hashed so far and whether the
file is verified, which is what the progress counts (`bytes_done`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Final

from npu_runtime.fetch.listing import Listing, RemoteFile

# How a file came to be verified.
STREAMED: Final = "streamed"  # hashed while its bytes arrived, by this fetch
BY_CLIENT: Final = "client"  # by the hub's client, against this fetch's listing
FROM_DISK: Final = "disk"  # hashed from disk after the download


class BodyMismatch(Exception):
    """A body's bytes do not hash to what the listing says (raised inside the library's read)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: the body's hash differs from the listing's")
        self.path = path


def new_hash(remote: RemoteFile) -> Any | None:
    """The hash object the listing's hash of `remote` is computed with; None when it lists none."""
    if remote.sha256:
        return hashlib.sha256()
    if remote.sha1:
        return hashlib.sha1(b"blob %d\0" % remote.size)  # a git blob id: the header, then the bytes
    return None


def expected_digest(remote: RemoteFile) -> str | None:
    return remote.sha256 or remote.sha1


Identity = tuple[int, int, int, int]


def identity(path: Path) -> Identity | None:
    """What the snapshot entry `path` leads to (device, inode, size, mtime), None when nothing: a file
    verified once stays verified only while this does not change (a rename onto it, or a rewrite,
    changes it)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns


@dataclasses.dataclass
class _File:
    remote: RemoteFile
    verified: str | None = None  # STREAMED, BY_CLIENT, FROM_DISK: what the fetch concluded
    identity: Identity | None = None  # of what the snapshot entry led to when it was concluded
    streamed: bool = False  # the last body hashed to the listed digest (the fetch then checks where it went)
    stream: StreamHash | None = None
    failed: bool = False  # a body of this attempt did not match
    lost: str | None = None  # why this attempt's body could not be hashed while it streamed
    etags: set[str] = dataclasses.field(default_factory=set)  # what the hub answered as the file's ETag


class Verification:
    """The verification state of one fetch's listing: thread-safe, read by the progress thread."""

    def __init__(self, listing: Listing, *, streaming: bool = False, by_client: bool = False) -> None:
        self.listing = listing
        self.streaming = streaming  # the hub's bodies are hashed as they arrive (Hugging Face)
        self.by_client = by_client  # the hub's client verifies against this listing (ModelScope)
        self._files = {remote.path: _File(remote) for remote in listing.files}
        self._lock = threading.Lock()

    def remote(self, path: str) -> RemoteFile:
        return self._files[path].remote

    # --- while the bytes stream -------------------------------------------------------------

    def body(self, path: str, start: int) -> StreamHash | None:
        """The hash a body of `path` that starts at byte `start` feeds, or None when it cannot be hashed
        while it streams (the file is then hashed from disk after the download)."""
        with self._lock:
            state = self._files[path]
            state.verified, state.streamed, state.failed = None, False, False
            if start == 0:
                hasher = new_hash(state.remote)
                if hasher is None:
                    state.lost, state.stream = "the listing has no hash for it", None
                    return None
                state.lost, state.stream = None, StreamHash(state.remote, hasher)
                return state.stream
            if state.stream is None or not state.stream.resume(start):
                state.lost, state.stream = f"a body resumed at byte {start}, not where its hash was", None
                return None
            return state.stream

    def not_hashable(self, path: str, reason: str) -> None:
        """A body of `path` arrived in a form that cannot be hashed as it comes (e.g. compressed)."""
        with self._lock:
            state = self._files[path]
            state.verified, state.streamed, state.stream, state.lost = None, False, None, reason

    def ended(self, path: str, stream: StreamHash) -> None:
        """A body ended: the file is verified when its hash covered exactly [0, size) and matches;
        BodyMismatch when it covered the whole size and does not."""
        with self._lock:
            state = self._files[path]
            if state.stream is not stream or stream.position != state.remote.size:
                return  # a shorter body: the library resumes it or fails on its size
            if stream.hexdigest() != expected_digest(state.remote):
                state.failed, state.stream = True, None
                raise BodyMismatch(path)
            state.streamed = True
            state.stream = None

    def etag(self, path: str, value: str) -> None:
        """The hub answered `value` as the ETag of `path` (huggingface_hub names the file's blob after it)."""
        with self._lock:
            self._files[path].etags.add(value)

    # --- after the download -----------------------------------------------------------------

    def streamed(self, path: str) -> bool:
        """The last body of `path` hashed to the listed digest while it arrived."""
        return self._files[path].streamed

    def etags_agree(self) -> bool:
        """Every ETag the hub answered is the listed hash of the file it was answered for."""
        with self._lock:
            return all(e == expected_digest(f.remote) for f in self._files.values() for e in f.etags)

    def etags_of(self, path: str) -> set[str]:
        with self._lock:
            return set(self._files[path].etags)

    def mark(self, path: str, how: str, found: Identity) -> None:
        with self._lock:
            state = self._files[path]
            state.verified, state.identity = how, found

    def unmark(self, path: str) -> None:
        with self._lock:
            state = self._files[path]
            state.verified, state.identity = None, None

    def settled(self, path: str) -> bool:
        """Verified, hashed as it arrived, or arriving now: nothing to hash from disk for it (yet)."""
        state = self._files[path]
        return state.verified is not None or state.streamed or state.stream is not None

    def still_verified(self, path: str, found: Identity | None) -> bool:
        """`path` was verified, and its snapshot entry still leads to the same file."""
        state = self._files[path]
        return state.verified is not None and found is not None and state.identity == found

    def failed(self) -> list[str]:
        """The files whose body did not match in this attempt."""
        with self._lock:
            return sorted(path for path, state in self._files.items() if state.failed)

    def lost(self) -> dict[str, str]:
        """The files whose last body could not be hashed while it streamed, and why."""
        with self._lock:
            return {path: state.lost for path, state in self._files.items() if state.lost and not state.verified}

    def reset(self, path: str) -> None:
        """`path` is fetched again: nothing about it is verified any more."""
        with self._lock:
            state = self._files[path]
            state.verified, state.identity, state.streamed, state.stream = None, None, False, None
            state.failed, state.lost = False, None
            state.etags.clear()

    # --- progress ---------------------------------------------------------------------------

    def bytes_done(self) -> int:
        """Bytes that passed a hash: every verified file, and the hashed prefix of each file in flight."""
        total = 0
        for state in list(self._files.values()):
            if state.verified is not None or state.streamed:
                total += state.remote.size
            elif (stream := state.stream) is not None:
                total += min(stream.position, state.remote.size)
        return total

    def files_done(self) -> int:
        return sum(1 for state in list(self._files.values()) if state.verified is not None or state.streamed)


class StreamHash:
    """The hash of one file's bytes as a library reads them, body after body: `position` is how many
    bytes of the file it covers. A body that resumes a cut one continues it only when it starts
    exactly there, which is where the library's file ends when the library writes every byte it is
    handed (the Hugging Face check hands huggingface_hub whole read chunks, huggingface.py says how)."""

    def __init__(self, remote: RemoteFile, hasher: Any) -> None:
        self.remote = remote
        self.position = 0
        self._hasher = hasher

    def resume(self, start: int) -> bool:
        return start == self.position

    def update(self, data: bytes) -> None:
        self._hasher.update(data)
        self.position += len(data)

    def hexdigest(self) -> str:
        return str(self._hasher.hexdigest())
