"""The Hugging Face hub: `huggingface_hub`'s listing and download, each body checked on its HTTP client."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from npu_runtime.fetch import layout
from npu_runtime.fetch.bodies import EXPECTED_BODIES, BodyTooLong
from npu_runtime.fetch.disk import remove_tree
from npu_runtime.fetch.hub import (
    ACCESS_DENIED,
    DEFAULT_REVISIONS,
    HUGGING_FACE,
    NOT_FOUND,
    FetchError,
    FetchOptions,
    library_cache,
    log,
)
from npu_runtime.fetch.listing import Listing, ListingError, RemoteFile, as_name, check_commit, is_commit
from npu_runtime.fetch.verify import STREAMED, StreamHash, Verification, expected_digest

if TYPE_CHECKING:
    import httpx

    # What a listed file's body is replaced with: (the body, its byte limit, the path, its hash, the verification).
    CheckedBody = Callable[[Any, int, str, StreamHash | None, Verification], httpx.SyncByteStream]


class HuggingFaceHub:
    """`huggingface_hub`: its standard cache (`models--org--name/{blobs,snapshots/<commit>}`), per endpoint.

    Each file is hashed while its body streams, by the check on the library's HTTP client
    (`_guard_huggingface_hub`); huggingface_hub itself compares only the size, after the body.
    """

    default_revision = DEFAULT_REVISIONS[HUGGING_FACE]

    def repo_folder(self, options: FetchOptions) -> Path:
        return library_cache(options) / ("models--" + layout.repository_name(options.repo))

    def drop_orphans(self, options: FetchOptions) -> None:
        """Partial files of killed downloads: huggingface_hub 1.x writes to a file unique to the process
        and never reuses it (huggingface_hub#4228), so under our lock nobody else's is in flight. And
        the library's own tree listings: this fetch has its checked listing, the library lists again."""
        folder = self.repo_folder(options)
        for orphan in (folder / "blobs").glob("*.incomplete"):
            orphan.unlink(missing_ok=True)
        remove_tree(folder / "trees", folder)

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
            log(f"{seam}: every file is hashed from disk, each as soon as it is downloaded")
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
        EXPECTED_BODIES.expect(options.repo, listing, verification)
        if len(names) == 1:  # config.json first: one file, without the revision and tree requests around it
            path = hf_hub_download(
                options.repo,
                names[0],
                revision=listing.commit,
                cache_dir=library_cache(options),
                endpoint=options.endpoint,
                token=options.token or False,
            )
            return Path(path).parents[len(names[0].split("/")) - 1]
        return Path(
            snapshot_download(
                options.repo,
                revision=listing.commit,
                cache_dir=library_cache(options),
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


# --- the check on huggingface_hub's HTTP client ---------------------------------------------------

_GUARDED: list[bool] = []


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
    checked_body = _checked_body_type()
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    def check(response: httpx.Response) -> None:
        _check_response(response, checked_body)

    def guarded_client() -> httpx.Client:
        client = default_client_factory()
        client.event_hooks["response"] = [*client.event_hooks["response"], check]
        return client

    set_client_factory(guarded_client)
    _GUARDED.append(True)


def _checked_body_type() -> CheckedBody:
    """The stream class a listed file's body is replaced with (httpx is imported only for a Hugging Face fetch)."""
    import httpx
    from huggingface_hub import constants

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
            chunks = _cut_off(self.inner, self.limit, self.path)
            if self.hashed is None:
                yield from chunks
                return
            size = constants.DOWNLOAD_CHUNK_SIZE
            yield from _hashed_pieces(chunks, size, self.path, self.hashed, self.verification)

        def close(self) -> None:
            self.inner.close()

    return Checked


def _cut_off(chunks: Iterable[bytes], limit: int, path: str) -> Iterator[bytes]:
    """The chunks of a body, raising BodyTooLong as soon as they go past `limit` bytes."""
    seen = 0
    for chunk in chunks:
        seen += len(chunk)
        if seen > limit:
            raise BodyTooLong(f"{path}: the endpoint sent more bytes than the {limit} listed")
        yield chunk


def _hashed_pieces(
    chunks: Iterable[bytes], size: int, path: str, hashed: StreamHash, verification: Verification
) -> Iterator[bytes]:
    """The body in whole pieces of `size` bytes (the last one shorter), each hashed as it is handed on."""
    pending: list[bytes] = []
    held = 0
    for chunk in chunks:
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
    verification.ended(path, hashed)  # ...and BodyMismatch stops it before


def _check_response(response: httpx.Response, checked_body: CheckedBody) -> None:
    """The response hook: checks a revision answer, records a listed file's ETag and redirect, and
    replaces a listed file's body with a `checked_body`."""
    request = response.request
    first = response.history[0].request if response.history else request
    path = urllib.parse.unquote(first.url.path)
    _check_revision_answer(response, path)
    body = EXPECTED_BODIES.body(str(first.url), path)
    if body is None:
        return
    remote, verification = body.remote, body.verification
    if response.is_redirect and (location := response.headers.get("Location")):
        EXPECTED_BODIES.alias(str(request.url.join(location)), body)  # the library may GET it there itself
    if first.method == "HEAD":
        if etag := response.headers.get("X-Linked-Etag") or response.headers.get("ETag"):
            verification.etag(remote.path, _normalize_etag(etag))
        return
    if first.method != "GET" or response.status_code not in (200, 206):
        return
    start = _range_start(response)
    hashed = _body_hash(response, remote, verification, start)
    limit = max(remote.size - max(start, 0), 0)
    response.stream = checked_body(response.stream, limit, remote.path, hashed, verification)


def _check_revision_answer(response: httpx.Response, path: str) -> None:
    """A revision answer for a pinned commit must name that commit."""
    if (commit := EXPECTED_BODIES.commit(path)) is not None and response.status_code == 200:
        response.read()
        if response.json().get("sha") != commit:
            raise ListingError(f"the hub answered another commit than {commit} for it")


def _range_start(response: httpx.Response) -> int:
    """Where a body starts in its file: 0, the start of a plain Range request's 206, else -1."""
    if response.status_code != 206:
        return 0
    ranged = re.fullmatch(r"bytes=(\d+)-", response.request.headers.get("Range", "").strip())
    return int(ranged[1]) if ranged else -1


def _body_hash(
    response: httpx.Response, remote: RemoteFile, verification: Verification, start: int
) -> StreamHash | None:
    """The hash a body streams into, when the fetch hashes while streaming and this body can be."""
    if not verification.streaming:
        return None
    if response.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
        verification.not_hashable(remote.path, "its body came compressed")
    elif start < 0:
        verification.not_hashable(remote.path, "a partial body without a plain Range request")
    else:
        return verification.body(remote.path, start)
    return None
