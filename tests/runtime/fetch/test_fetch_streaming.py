"""Verified while the bytes arrive: Hugging Face bodies hashed as huggingface_hub reads them, ModelScope
files hashed by modelscope_hub against the fetch's own listing; the hash from disk only where neither did.

The hub is npu_sandbox.fixtures.local_hub with repositories built here (a repository whose served
bytes differ from what it lists is a `Repo` whose `data` differs from its hashes), the clients are
the real huggingface_hub and modelscope_hub. `hashed_from_disk` records what the fetch hashed from disk
after a download, which is how a test tells a stream's verification from the fallback's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import huggingface_hub
import modelscope_hub
import pytest
from npu_runtime.fetch import disk, driver, verify
from npu_runtime.fetch import download as fetch
from npu_runtime.fetch.hub import HASH_MISMATCH, HUGGING_FACE, MODEL_SCOPE, FetchError, FetchOptions
from npu_runtime.fetch.huggingface import HuggingFaceHub
from npu_runtime.fetch.listing import Listing, RemoteFile
from npu_runtime.fetch.progress import Progress
from npu_sandbox.fixtures.local_hub import LocalHub, Repo, RepoFile

from tests.runtime.conftest import HUBS

pytestmark = pytest.mark.usefixtures("quiet_hub_clients")

REPO = "org/streamed"
BIG = "model-00001-of-00002.safetensors"
SMALL = "model-00002-of-00002.safetensors"
MIB = 1 << 20


@pytest.fixture(scope="module")
def streamed_repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """config.json and a tokenizer (git blobs, sha1), a 24 MiB and a small shard (LFS, sha256)."""
    directory = tmp_path_factory.mktemp("streamed-repo")
    rng = random.Random(36)
    (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}\n')
    (directory / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}\n')
    (directory / BIG).write_bytes(rng.randbytes(24 * MIB))
    (directory / SMALL).write_bytes(rng.randbytes(3 * MIB + 17))
    return Repo.from_directory(REPO, directory)


def serving(repo: Repo, path: str, data: bytes) -> Repo:
    """`repo`, listing `path` with its size and hashes as before but serving `data` for it."""
    return Repo(repo.repo_id, repo.commit, {**repo.files, path: dataclasses.replace(repo.files[path], data=data)})


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def options(hub: LocalHub, cache: Path, which: str) -> FetchOptions:
    return FetchOptions(hub=which, repo=REPO, revision=None, cache=cache, endpoint=hub.url)


def run_fetch(opts: FetchOptions, progress: Progress | None = None) -> tuple[Path, Progress]:
    progress = progress or Progress(source=opts.hub, repository=opts.repo)
    return driver.fetch(opts, fetch.hub_for(opts.hub), progress), progress


@pytest.fixture
def hashed_from_disk(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the fetch hashed from disk (the fallback: as they landed, or after the download)."""
    seen: list[str] = []
    original = disk._hash_one

    def recording(snapshot: Path, remote: RemoteFile, verification: Any) -> bool:
        seen.append(remote.path)
        return original(snapshot, remote, verification)

    monkeypatch.setattr(disk, "_hash_one", recording)
    return seen


def larger_than(cache: Path, size: int) -> list[Path]:
    """Files (blobs, snapshot files, partial files) in the cache with more than `size` bytes."""
    return [p for p in cache.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size > size]


# --- the verification itself ----------------------------------------------------------------------


def remote_of(data: bytes, path: str = "w.safetensors") -> RemoteFile:
    return RemoteFile(path, len(data), hashlib.sha256(data).hexdigest(), None)


def test_a_stream_hash_over_pieces_is_the_files_hash_and_a_resumed_body_continues_it() -> None:
    data = random.Random(1).randbytes(5 * MIB + 123)
    remote = remote_of(data)
    verification = verify.Verification(Listing("0" * 40, (remote,)), streaming=True)
    stream = verification.body(remote.path, 0)
    assert stream is not None
    for at in range(0, 2 * MIB, MIB // 2):  # a body cut after two MiB...
        stream.update(data[at : at + MIB // 2])
    assert verification.bytes_done() == 2 * MIB  # the hashed prefix of a file in flight
    assert verification.body(remote.path, 2 * MIB) is stream  # ...whose library asks for the rest from there
    stream.update(data[2 * MIB :])
    verification.ended(remote.path, stream)
    assert verification.streamed(remote.path) and verification.bytes_done() == remote.size


def test_a_resume_anywhere_else_leaves_the_file_to_the_disk_hash() -> None:
    data = random.Random(2).randbytes(3 * MIB)
    remote = remote_of(data)
    verification = verify.Verification(Listing("0" * 40, (remote,)), streaming=True)
    stream = verification.body(remote.path, 0)
    assert stream is not None
    stream.update(data[: MIB + 10])
    assert verification.body(remote.path, MIB) is None
    assert "byte 1048576" in verification.lost()[remote.path] and not verification.streamed(remote.path)
    assert verification.body(remote.path, 0) is not None  # a body from the start hashes afresh


def test_a_body_that_does_not_hash_to_the_listing_fails_and_drops_out_of_the_progress() -> None:
    good = random.Random(3).randbytes(2 * MIB)
    other = remote_of(b"x" * 10, "other.json")
    remote = remote_of(good)
    verification = verify.Verification(Listing("0" * 40, (remote, other)), streaming=True)
    stream = verification.body(remote.path, 0)
    assert stream is not None
    stream.update(flipped(good, MIB))
    assert verification.bytes_done() == remote.size  # hashed, not yet compared
    with pytest.raises(verify.BodyMismatch):
        verification.ended(remote.path, stream)
    assert verification.failed() == [remote.path] and verification.bytes_done() == 0
    # A git blob id (a file Hugging Face does not store in LFS) is hashed the same way.
    text = b'{"a": 1}\n'
    blob = RemoteFile("a.json", len(text), None, hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest())
    digest = verify.new_hash(blob)
    assert digest is not None
    digest.update(text)
    assert digest.hexdigest() == verify.expected_digest(blob)


def test_a_streamed_file_counts_only_as_the_blob_its_listed_hash_names_while_every_etag_agrees(
    tmp_path: Path,
) -> None:
    """huggingface_hub writes a body to `blobs/<the ETag the hub answered>` and links the snapshot entry
    there: a streamed body is the file's only when the entry leads to the blob named by the file's
    listed hash, and no ETag of the fetch names a blob another file's body could have gone to."""
    hub = HuggingFaceHub()
    opts = FetchOptions(hub=HUGGING_FACE, repo=REPO, revision=None, cache=tmp_path, endpoint="http://127.0.0.1:1")
    data = random.Random(5).randbytes(MIB)
    a, b = remote_of(data, "a.safetensors"), remote_of(data[::-1], "b.safetensors")
    listing = Listing("1" * 40, (a, b))
    snapshot = hub.repo_folder(opts) / "snapshots" / listing.commit
    (hub.repo_folder(opts) / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (hub.repo_folder(opts) / "blobs" / str(a.sha256)).write_bytes(data)
    (snapshot / a.path).symlink_to(f"../../blobs/{a.sha256}")
    verification = verify.Verification(listing, streaming=True)
    stream = verification.body(a.path, 0)
    assert stream is not None
    stream.update(data)
    verification.ended(a.path, stream)
    assert hub.verified_by_download(opts, snapshot, a, verification) is None  # no ETag seen: no blob name known
    verification.etag(a.path, str(a.sha256))
    assert hub.verified_by_download(opts, snapshot, a, verification) == verify.STREAMED
    verification.etag(b.path, str(a.sha256))  # b answered as a's blob: b's body may be what lies there
    assert hub.verified_by_download(opts, snapshot, a, verification) is None
    verification.reset(b.path)
    (snapshot / a.path).unlink()
    (snapshot / a.path).symlink_to(f"../../blobs/{b.sha256}")  # an entry leading to another blob
    assert hub.verified_by_download(opts, snapshot, a, verification) is None


# --- against the hub ------------------------------------------------------------------------------


@pytest.mark.parametrize("which", HUBS)
def test_every_file_is_verified_while_it_streams(
    which: str, streamed_repo: Repo, tmp_path: Path, hashed_from_disk: list[str]
) -> None:
    with LocalHub([streamed_repo]) as hub:
        snapshot, progress = run_fetch(options(hub, tmp_path / "cache", which))
    assert hashed_from_disk == []  # nothing was left to hash from disk
    for name, remote in streamed_repo.files.items():
        assert (snapshot / name).read_bytes() == remote.data
    assert progress.phase == "Ready"


@pytest.mark.parametrize("which", HUBS)
def test_a_corrupted_config_json_is_never_planned_and_no_weight_is_asked_for(
    which: str, streamed_repo: Repo, tmp_path: Path, hashed_from_disk: list[str]
) -> None:
    data = streamed_repo.files["config.json"].data
    corrupted = serving(streamed_repo, "config.json", flipped(data, len(data) // 2))
    cache, planned = tmp_path / "cache", list[Path]()
    with LocalHub([corrupted]) as hub:
        opts = options(hub, cache, which)
        with pytest.raises(FetchError) as failure:
            driver.fetch(opts, fetch.hub_for(which), Progress(source=which, repository=REPO), on_config=planned.append)
        served = dict(hub.served)
    assert failure.value.reason == HASH_MISMATCH and "config.json" in failure.value.message
    assert planned == [] and hashed_from_disk == []  # caught while it streamed, never planned
    assert served == {f"{REPO}/config.json": 2}  # fetched again once, then given up; no weight was asked for
    assert not list(cache.rglob("config.json")) and not list(cache.rglob(".npu-complete/*.json"))


@pytest.mark.parametrize("which", HUBS)
@pytest.mark.parametrize("fault", ["endless", "longer than listed"])
def test_a_config_json_past_its_listed_size_is_a_hash_mismatch_and_never_planned(
    which: str, fault: str, streamed_repo: Repo, tmp_path: Path
) -> None:
    cache, planned = tmp_path / "cache", list[Path]()
    with LocalHub([streamed_repo]) as hub:
        if fault == "endless":
            hub.faults.endless.add("config.json")
        else:
            hub.faults.listed_sizes["config.json"] = streamed_repo.files["config.json"].size - 8
        with pytest.raises(FetchError) as failure:
            driver.fetch(
                options(hub, cache, which), fetch.hub_for(which), Progress(source=which, repository=REPO),
                on_config=planned.append,
            )  # fmt: skip
        served = hub.bytes_served
    assert failure.value.reason == HASH_MISMATCH and "config.json" in failure.value.message
    assert planned == [] and served < 16 * MIB  # stopped past the listed size, never the endless body
    assert not list(cache.rglob("config.json")) and not list(cache.rglob(".npu-complete/*.json"))


@pytest.mark.parametrize("which", HUBS)
def test_a_cut_config_json_is_fetched_again_and_planned_whole(which: str, streamed_repo: Repo, tmp_path: Path) -> None:
    config, planned = streamed_repo.files["config.json"], list[bytes]()
    with LocalHub([streamed_repo]) as hub:
        hub.faults.cut_after["config.json"] = config.size // 3  # once
        opts = options(hub, tmp_path / "cache", which)
        plan = lambda snapshot: planned.append((snapshot / "config.json").read_bytes())  # noqa: E731
        snapshot = driver.fetch(opts, fetch.hub_for(which), Progress(source=which, repository=REPO), on_config=plan)
        served = hub.served[f"{REPO}/config.json"]
    assert planned == [config.data] and (snapshot / "config.json").read_bytes() == config.data
    assert served == 2  # the cut body, then the whole one


def test_the_modelscope_clients_route_probe_runs_beside_the_listing(streamed_repo: Repo, tmp_path: Path) -> None:
    """modelscope_hub probes the endpoint for a cloud-internal route once per client, before its first
    download: the fetch starts that probe beside the file listing, so no download waits for it."""
    with LocalHub([streamed_repo]) as hub:
        hub.faults.listing_waits_for_probe = True  # the listing is answered once the probe arrived (or in 5 s)
        snapshot, _ = run_fetch(options(hub, tmp_path / "cache", MODEL_SCOPE))
    assert hub.listings_after_probe == [True]
    assert (snapshot / BIG).read_bytes() == streamed_repo.files[BIG].data


@pytest.mark.parametrize("which", HUBS)
def test_a_corrupted_byte_in_the_middle_is_caught_before_the_file_is_linked(
    which: str, streamed_repo: Repo, tmp_path: Path, hashed_from_disk: list[str]
) -> None:
    size = streamed_repo.files[BIG].size
    corrupted = serving(streamed_repo, BIG, flipped(streamed_repo.files[BIG].data, size // 2))
    cache = tmp_path / "cache"
    with LocalHub([corrupted]) as hub:
        with pytest.raises(FetchError) as failure:
            run_fetch(options(hub, cache, which))
        served = hub.served[f"{REPO}/{BIG}"]
    assert failure.value.reason == HASH_MISMATCH and BIG in failure.value.message
    # Caught in the stream (Hugging Face) or by the client (ModelScope): never hashed from disk, and
    # neither a snapshot entry, nor a blob, nor a partial file of it is left; no marker.
    assert BIG not in hashed_from_disk
    assert not list(cache.rglob(BIG)) and not larger_than(cache, streamed_repo.files[SMALL].size)
    assert not list(cache.rglob(".npu-complete/*.json"))
    # Fetched again before giving up: once by this fetch (Hugging Face), by the library's own retries (ModelScope).
    assert served == (2 if which == HUGGING_FACE else 3)
    with LocalHub([streamed_repo]) as hub:  # the hub is right again: the next start completes
        snapshot, _ = run_fetch(options(hub, cache, which))
    assert (snapshot / BIG).read_bytes() == streamed_repo.files[BIG].data


class CutOnce(dict[str, int]):
    """`Faults.cut_after` that, when the hub takes the cut, makes the hub serve `then` from the next
    request on: the cut body carries different bytes than the body that resumes it."""

    def __init__(self, hub: LocalHub, path: str, at: int, then: Repo) -> None:
        super().__init__({path: at})
        self.hub, self.then = hub, then

    def pop(self, key: str, default: Any = None) -> Any:
        value = super().pop(key, default)
        if value is not None:
            self.hub.push(self.then)
        return value


@pytest.mark.parametrize("which", HUBS)
def test_a_cut_body_resumes_and_its_hash_covers_the_resumed_prefix(
    which: str, streamed_repo: Repo, tmp_path: Path, hashed_from_disk: list[str]
) -> None:
    size = streamed_repo.files[BIG].size
    # A cut that is not on a chunk boundary: Hugging Face resumes from the last whole MiB it wrote.
    with LocalHub([streamed_repo]) as hub:
        hub.faults.cut_after[BIG] = size // 2 + 12345
        snapshot, _ = run_fetch(options(hub, tmp_path / "clean", which))
        resumed = [start for path, start in hub.ranges if path == BIG]
    assert resumed and 0 < resumed[0] <= size // 2 + 12345
    assert (snapshot / BIG).read_bytes() == streamed_repo.files[BIG].data
    assert hashed_from_disk == []  # the resumed file was verified as it streamed, prefix and rest

    # The cut body's prefix carries a wrong byte, the resumed rest is right: the file is wrong, and caught.
    corrupted = serving(streamed_repo, BIG, flipped(streamed_repo.files[BIG].data, size // 4))
    with LocalHub([corrupted]) as hub:
        hub.faults.cut_after = CutOnce(hub, BIG, size // 2 + 12345, then=streamed_repo)
        snapshot, _ = run_fetch(options(hub, tmp_path / "prefix", which))
        assert next(start for path, start in hub.ranges if path == BIG) > size // 4  # the wrong byte was kept
        assert hub.served[f"{REPO}/{BIG}"] == 3  # cut, resumed (wrong as a whole), fetched whole again
    assert (snapshot / BIG).read_bytes() == streamed_repo.files[BIG].data
    assert BIG not in hashed_from_disk


def test_a_partial_file_a_killed_pod_left_is_resumed_and_verified_over_its_prefix(
    streamed_repo: Repo, tmp_path: Path
) -> None:
    """ModelScope resumes the `.incomplete` file a killed pod left on the cache volume; a wrong byte in
    that prefix is caught (modelscope_hub hashes the prefix from disk before it appends)."""
    cache, data = tmp_path / "cache", streamed_repo.files[BIG].data
    with LocalHub([streamed_repo]) as hub:
        opts = options(hub, cache, MODEL_SCOPE)
        hub_ = fetch.hub_for(MODEL_SCOPE)
        partial = hub_.repo_folder(opts) / "snapshots" / streamed_repo.commit / (BIG + ".incomplete")
        partial.parent.mkdir(parents=True)
        partial.write_bytes(flipped(data[: 10 * MIB], 5 * MIB))
        snapshot, _ = run_fetch(opts)
        assert [start for path, start in hub.ranges if path == BIG][:1] == [10 * MIB]  # it resumed from the partial
        assert hub.served[f"{REPO}/{BIG}"] == 2  # the rest, then (the whole failing its hash) the whole file
    assert (snapshot / BIG).read_bytes() == data


@pytest.mark.parametrize("which", HUBS)
def test_progress_counts_verified_bytes(which: str, streamed_repo: Repo, tmp_path: Path) -> None:
    size = streamed_repo.files[BIG].size
    total = sum(f.size for f in streamed_repo.files.values())
    corrupted = serving(streamed_repo, BIG, flipped(streamed_repo.files[BIG].data, size - 1))
    progress = Progress(source=which, repository=REPO)
    seen: list[tuple[str, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append((progress.phase, progress.bytes_done))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    with LocalHub([corrupted]) as hub:
        hub.rate = 12 * MIB  # two seconds a body: the progress is measured while it streams
        sampler.start()
        try:
            with pytest.raises(FetchError) as failure:
                run_fetch(options(hub, tmp_path / "cache", which), progress)
        finally:
            stop.set()
            sampler.join()
    assert failure.value.reason == HASH_MISMATCH
    # While it streamed, the body's hashed bytes counted; once its hash failed, they did not.
    downloading = [done for phase, done in seen if phase == "Downloading"]
    assert any(total - size < done < total for done in downloading)
    assert (progress.bytes_done, progress.files_done) == (total - size, len(streamed_repo.files) - 1)


@dataclasses.dataclass(frozen=True)
class AnsweredEtag(RepoFile):
    """A file whose ETag the hub answers as `answered`, not as its listed hash."""

    answered: str = ""

    @property
    def etag(self) -> str:
        return self.answered


def test_an_etag_that_names_another_files_blob_never_makes_a_snapshot(tmp_path: Path) -> None:
    """huggingface_hub names a blob after the ETag the hub answers. A hub that answers another file's ETag
    as config.json's hash (same size) makes it share config.json's blob: that body verifies as its own
    file, and lands in the blob config.json (fetched and verified first, for the planner) links to."""
    directory = tmp_path / "repo"
    directory.mkdir()
    (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}\n')
    (directory / "generation_config.json").write_text(
        '{"do_sample": true, "temperature": 9.0, "top_k": 9999999999999}\n'
    )
    (directory / "model.safetensors").write_bytes(random.Random(4).randbytes(MIB))
    repo = Repo.from_directory(REPO, directory)
    config, other = repo.files["config.json"], repo.files["generation_config.json"]
    assert config.size == other.size
    forged = Repo(
        REPO, repo.commit, {**repo.files, other.path: AnsweredEtag(**dataclasses.asdict(other), answered=config.sha1)}
    )
    cache = tmp_path / "cache"
    planned: list[bytes] = []
    with LocalHub([forged]) as hub:
        opts = options(hub, cache, HUGGING_FACE)
        progress = Progress(source=opts.hub, repository=REPO)
        plan = lambda snapshot: planned.append((snapshot / "config.json").read_bytes())  # noqa: E731
        with pytest.raises(FetchError) as failure:
            driver.fetch(opts, fetch.hub_for(opts.hub), progress, on_config=plan)
    assert planned == [config.data]
    assert failure.value.reason == HASH_MISMATCH
    assert not list(cache.rglob(".npu-complete/*.json"))


@pytest.fixture
def no_seams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client versions this fetch's seams were not checked against."""
    monkeypatch.setattr(huggingface_hub, "__version__", "2.0.0")
    monkeypatch.setattr(modelscope_hub, "__version__", "1.0.0")


@pytest.mark.parametrize("which", HUBS)
@pytest.mark.usefixtures("no_seams")
def test_without_the_seams_every_file_is_hashed_from_disk(
    which: str, streamed_repo: Repo, tmp_path: Path, hashed_from_disk: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with LocalHub([streamed_repo]) as hub:
        _, progress = run_fetch(options(hub, tmp_path / "cache", which))
    assert progress.phase == "Ready"
    assert sorted(hashed_from_disk) == sorted(streamed_repo.files)
    assert "is not a version whose download was checked" in capsys.readouterr().err
    corrupted = serving(streamed_repo, BIG, flipped(streamed_repo.files[BIG].data, MIB))
    with LocalHub([corrupted]) as hub, pytest.raises(FetchError) as failure:
        run_fetch(options(hub, tmp_path / "other", which))
    assert failure.value.reason == HASH_MISMATCH


@pytest.mark.parametrize("which", HUBS)
@pytest.mark.usefixtures("no_seams")
def test_a_file_left_to_the_disk_hash_is_hashed_as_soon_as_it_lands(
    which: str, streamed_repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What nothing verified as it arrived (here: no seams; in a pod: hf_xet's downloads, files already in
    the cache) is hashed while the rest still downloads, so only the last files wait for the hash."""
    seen: list[tuple[str, bool]] = []  # (the file hashed, whether the big shard had landed then)
    original = disk._hash_one
    with LocalHub([streamed_repo]) as hub:

        def recording(snapshot: Path, remote: RemoteFile, verification: Any) -> bool:
            seen.append((remote.path, (snapshot / BIG).exists()))
            return original(snapshot, remote, verification)

        monkeypatch.setattr(disk, "_hash_one", recording)
        hub.rate = 12 * MIB  # the big shard streams for two seconds
        _, progress = run_fetch(options(hub, tmp_path / "cache", which))
    assert progress.phase == "Ready"
    assert (SMALL, False) in seen  # hashed while the big shard was still on its way
    assert sorted(path for path, _ in seen) == sorted(streamed_repo.files)  # each file once


class CdnFront:
    """A Hugging Face endpoint in front of a LocalHub that answers a HEAD for an LFS file the way the
    Hub does: a 302 to another host (a CDN's signed URL) carrying the file's commit, ETag and size,
    which huggingface_hub does not follow; the library then GETs the file there."""

    def __init__(self, hub: LocalHub) -> None:
        self.hub, self.cdn_gets = hub, 0
        self.objects: dict[str, str] = {}  # an opaque CDN object name -> the hub's path
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_HEAD(self) -> None:
                self.relay(head=True)

            def do_GET(self) -> None:
                self.relay(head=False)

            def relay(self, *, head: bool) -> None:
                path = self.path
                if path.startswith("/cdn/"):  # the CDN: the hub's file, by the object the redirect named
                    front.cdn_gets += not head
                    path = front.objects[path.removeprefix("/cdn/").split("?")[0]]
                elif head and "/resolve/" in path and path.endswith(".safetensors"):
                    answer = self.forward("HEAD", path)
                    self.send_response(302)
                    name = hashlib.sha256(path.encode()).hexdigest()
                    front.objects[name] = path
                    cdn = f"http://localhost:{front.port}/cdn/{name}?X-Signature=abc"
                    self.send_header("Location", cdn)
                    self.send_header("X-Repo-Commit", answer.headers["X-Repo-Commit"])
                    self.send_header("X-Linked-Etag", answer.headers["ETag"])
                    self.send_header("X-Linked-Size", answer.headers["Content-Length"])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                answer = self.forward("HEAD" if head else "GET", path)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    if name.lower() not in ("connection", "transfer-encoding"):
                        self.send_header(name, value)
                self.end_headers()
                while not head and (block := answer.read(1 << 20)):
                    self.wfile.write(block)

            def forward(self, method: str, path: str) -> Any:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("range", "authorization")}
                request = urllib.request.Request(self.hub_url + path, method=method, headers=headers)
                try:
                    return urllib.request.urlopen(request, timeout=30)
                except urllib.error.HTTPError as error:
                    return error

            hub_url = hub.url

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong byte"])
def test_a_body_the_hub_redirects_to_another_host_is_verified_as_it_streams_there(
    wrong: bool, streamed_repo: Repo, tmp_path: Path, hashed_from_disk: list[str]
) -> None:
    size = streamed_repo.files[BIG].size
    served = serving(streamed_repo, BIG, flipped(streamed_repo.files[BIG].data, size // 2)) if wrong else streamed_repo
    with LocalHub([served]) as hub:
        front = CdnFront(hub)
        try:
            opts = FetchOptions(hub=HUGGING_FACE, repo=REPO, revision=None, cache=tmp_path, endpoint=front.url)
            if wrong:
                with pytest.raises(FetchError) as failure:
                    run_fetch(opts)
                assert failure.value.reason == HASH_MISMATCH
            else:
                snapshot, _ = run_fetch(opts)
                assert (snapshot / BIG).read_bytes() == streamed_repo.files[BIG].data
        finally:
            front.close()
    assert front.cdn_gets >= 2  # both shards came from the other host
    assert hashed_from_disk == []  # and were verified as they streamed from there
