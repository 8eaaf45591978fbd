"""The ModelScope hub: `modelscope_hub`'s listing and download, verified by the library against this listing."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from npu_runtime.fetch import layout
from npu_runtime.fetch.bodies import BodyTooLong
from npu_runtime.fetch.hub import (
    ACCESS_DENIED,
    CONFIG_FILE,
    DEFAULT_REVISIONS,
    HASH_MISMATCH,
    MODEL_SCOPE,
    NOT_FOUND,
    FetchError,
    FetchOptions,
    causes,
    fetch_label,
    library_cache,
    log,
)
from npu_runtime.fetch.listing import Listing, RemoteFile, as_name, check_commit, is_commit
from npu_runtime.fetch.verify import BY_CLIENT, STREAMED, BodyMismatch, Verification

_CONFIG_CHUNK: Final = 64 << 10


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

    default_revision = DEFAULT_REVISIONS[MODEL_SCOPE]

    def repo_folder(self, options: FetchOptions) -> Path:
        return library_cache(options) / "models" / layout.repository_name(options.repo)

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
            log(f"{seam}: every file is hashed from disk, each as soon as it is downloaded")
        return Verification(listing, by_client=seam is None)

    def download(
        self, options: FetchOptions, listing: Listing, names: Sequence[str], verification: Verification
    ) -> Path:
        if verification.by_client and list(names) == [CONFIG_FILE] and verification.remote(CONFIG_FILE).sha256:
            try:  # config.json first, alone
                return self._read_config(options, listing, verification)
            except (BodyMismatch, BodyTooLong):
                raise
            except Exception as exc:  # the library's download, with its retries, says what fails
                log(
                    f"{fetch_label(options)}: {CONFIG_FILE} alone failed ({type(exc).__name__}); the library fetches it"
                )
                verification.reset(CONFIG_FILE)
        if verification.by_client:
            wanted = set(names)
            files = [
                {"Path": f.path, "Type": "blob", "Size": f.size, "Sha256": f.sha256}
                for f in listing.files
                if f.path in wanted
            ]
            folder = self._api(options).download_repo(
                options.repo, "model", revision=listing.commit, cache_dir=str(library_cache(options)), file_list=files
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
                cache_dir=str(library_cache(options)),
                allow_patterns=[as_name(name) for name in names],
                endpoint=options.endpoint,
                token=options.token,
            )
        )

    def _read_config(self, options: FetchOptions, listing: Listing, verification: Verification) -> Path:
        """config.json alone, over the client's session: its body hashed as it streams, stopped past the
        listed size (`BodyTooLong`), and renamed into the snapshot only when it matches the listing
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
                        raise BodyTooLong(f"{CONFIG_FILE}: the endpoint sent more bytes than the {size} listed")
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

        found = list(causes(exc))
        for failed in found:  # a snapshot download raises one error listing each file's
            if isinstance(failed, errors.FileDownloadError):
                found += failed.failed_files.values()
        for cause in found:
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
