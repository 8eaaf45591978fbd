"""What a hub answers, checked before anything is written, linked or deleted: a hub is untrusted input.

A hub (or anything answering at a resource's `endpoint`) names the commit a revision resolves to
and lists the files with their sizes and hashes; both end up in paths on a shared cache volume.
So a commit must be a commit (40 hex digits, as Hugging Face and ModelScope both answer git
commits), and every listed path must be relative, normalised, and stay inside the snapshot. The
revision a resource asks for passes the same pattern as the CRD's (`REVISION_PATTERN`): the
runtime does not trust its arguments either.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Final

# A branch, tag or commit: letters, digits, `-` and `_`, single `.` or `/` between them; so no
# `..`, no leading or trailing separator, no `$`, no spaces. The CRD's revision fields carry the
# same pattern (a test compares them); Kubernetes' patterns are RE2, hence no look-ahead.
REVISION_PATTERN: Final = r"^[A-Za-z0-9]([-A-Za-z0-9_]|[./][-A-Za-z0-9_])*$"
REVISION_MAX_LENGTH: Final = 255
# A repository id, owner/name, as the CRD's pattern.
REPOSITORY_PATTERN: Final = r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$"
_COMMIT: Final = re.compile(r"^[0-9a-f]{40}$")
_HEX: Final = re.compile(r"^[0-9a-f]+$")
MAX_FILES: Final = 100_000
MAX_PATH_LENGTH: Final = 1024


class ListingError(ValueError):
    """The hub answered something that cannot be used safely; the message says what."""


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None
    sha1: str | None  # git blob id, where the hub gives no sha256


@dataclasses.dataclass(frozen=True)
class Listing:
    """A revision as the hub lists it: the commit it resolves to and its files."""

    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def check_revision(revision: str) -> str:
    if len(revision) > REVISION_MAX_LENGTH or not re.match(REVISION_PATTERN, revision):
        raise ListingError(f"--revision {revision!r} is not a branch, tag or commit name")
    return revision


def check_repository(repo: str) -> str:
    if len(repo) > 256 or not re.match(REPOSITORY_PATTERN, repo) or ".." in repo:
        raise ListingError(f"--repo {repo!r} is not a repository id (owner/name)")
    return repo


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def check_commit(commit: object) -> str:
    if not isinstance(commit, str) or not _COMMIT.match(commit):
        raise ListingError(f"the hub resolved the revision to {str(commit)[:80]!r}, which is not a commit id")
    return commit


def check_path(path: object) -> str:
    """`path` when it is relative, normalised and stays inside the directory it is joined to."""
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_LENGTH:
        raise ListingError(f"the hub listed a file without a usable path: {str(path)[:80]!r}")
    if (
        path.startswith("/")
        or "\\" in path
        or "\0" in path
        or posixpath.normpath(path) != path
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise ListingError(f"the hub listed {path[:200]!r}, which is not a relative path inside the repository")
    return path


def _check_hash(value: str | None, length: int, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != length or not _HEX.match(value):
        raise ListingError(f"the hub listed {path!r} with a hash that is not {length} hex digits")
    return value


def checked(listing: Listing) -> Listing:
    """The listing, when every part of it is safe to use; ListingError naming the first that is not."""
    check_commit(listing.commit)
    if len(listing.files) > MAX_FILES:
        raise ListingError(f"the hub listed {len(listing.files)} files, more than {MAX_FILES}")
    seen: set[str] = set()
    for remote in listing.files:
        check_path(remote.path)
        if remote.path in seen:
            raise ListingError(f"the hub listed {remote.path!r} twice")
        seen.add(remote.path)
        if isinstance(remote.size, bool) or not isinstance(remote.size, int) or remote.size < 0:
            raise ListingError(f"the hub listed {remote.path!r} with size {remote.size!r}")
        _check_hash(remote.sha256, 64, remote.path)
        _check_hash(remote.sha1, 40, remote.path)
    return listing


def as_name(path: str) -> str:
    """A glob pattern that matches exactly `path` (fnmatch, as both libraries match allow patterns):
    a file named `special_tokens[1].json` is a name, not a character class."""
    return re.sub(r"([*?\[])", r"[\1]", path)
