"""`npu-runtime fetch` with the real huggingface_hub and modelscope clients against a local hub.

The hub (npu_sandbox.fixtures.local_hub) serves the tiny generated model on 127.0.0.1 in each hub's API
shape; the clients are pointed at it with their endpoint settings. Faults are the hub's: a cut
connection, wrong bytes, a required token, unknown repositories and revisions.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from npu_runtime.fetch import download as fetch
from npu_runtime.fetch import driver
from npu_runtime.fetch.disk import file_matches
from npu_runtime.fetch.hub import (
    ACCESS_DENIED,
    CACHE_FULL,
    HASH_MISMATCH,
    HUGGING_FACE,
    MODEL_SCOPE,
    NOT_FOUND,
    FetchError,
    FetchOptions,
)
from npu_runtime.fetch.listing import RemoteFile
from npu_runtime.fetch.progress import Progress, StatusServer
from npu_sandbox.fixtures.local_hub import LocalHub, Repo

from tests.runtime.conftest import HUBS, REPO, WEIGHTS

BIG = "extra-00002.safetensors"

pytestmark = pytest.mark.usefixtures("quiet_hub_clients")


def options(hub: LocalHub, cache: Path, which: str, **changes: object) -> FetchOptions:
    base = FetchOptions(hub=which, repo=REPO, revision=None, cache=cache, endpoint=hub.url)
    return FetchOptions(**{**base.__dict__, **changes})


def run_fetch(opts: FetchOptions) -> tuple[Path, Progress]:
    progress = Progress(source=opts.hub, repository=opts.repo)
    return driver.fetch(opts, fetch.hub_for(opts.hub), progress), progress


@pytest.mark.parametrize("which", HUBS)
def test_a_revision_is_downloaded_checked_and_then_reused(
    which: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    snapshot, progress = run_fetch(options(hub, tmp_path / "cache", which))
    for name, remote in repo.files.items():
        assert (snapshot / name).read_bytes() == remote.data
        assert hub.served[f"{REPO}/{name}"] == 1
    expected_revision = repo.commit  # both hubs: the commit the branch points at
    assert progress.to_dict() == {
        "source": which,
        "repository": REPO,
        "revision": expected_revision,
        "phase": "Ready",
        "bytesDone": sum(f.size for f in repo.files.values()),
        "bytesTotal": sum(f.size for f in repo.files.values()),
        "filesDone": len(repo.files),
        "filesTotal": len(repo.files),
    }
    assert snapshot.parts[-2:] == ("snapshots", expected_revision)

    again, _ = run_fetch(options(hub, tmp_path / "cache", which))
    assert again == snapshot
    assert all(count == 1 for count in hub.served.values())  # the second start downloaded nothing


@pytest.fixture(scope="module")
def big_repo(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """The tiny model plus a 24 MiB shard: huggingface_hub writes what it received in whole chunks (1 MiB,
    as the fetch sets it), so only a cut after the first chunk leaves something to resume from."""
    directory = tmp_path_factory.mktemp("big-repo")
    for item in tiny_model.iterdir():
        (directory / item.name).write_bytes(item.read_bytes())
    (directory / BIG).write_bytes(random.Random(7).randbytes(24 << 20))
    return Repo.from_directory(REPO, directory)


@pytest.mark.parametrize("which", HUBS)
def test_a_cut_connection_resumes_where_it_stopped(which: str, big_repo: Repo, tmp_path: Path) -> None:
    size = big_repo.files[BIG].size
    with LocalHub([big_repo]) as hub:
        hub.faults.cut_after[BIG] = size // 2
        snapshot, _ = run_fetch(options(hub, tmp_path / "cache", which))
        assert (snapshot / BIG).read_bytes() == big_repo.files[BIG].data
        resumed_at = [start for path, start in hub.ranges if path == BIG]
        assert resumed_at and 0 < resumed_at[0] <= size // 2  # the rest was asked for, not the whole file again
        assert hub.served[f"{REPO}/{BIG}"] == 2
        assert hub.bytes_served < sum(f.size for f in big_repo.files.values()) + size // 2


@pytest.mark.parametrize("which", HUBS)
def test_wrong_bytes_are_never_marked_complete(which: str, hub: LocalHub, tmp_path: Path) -> None:
    hub.faults.corrupt.add(WEIGHTS)
    cache = tmp_path / "cache"
    with pytest.raises(FetchError) as failure:
        run_fetch(options(hub, cache, which))
    assert failure.value.reason == HASH_MISMATCH
    assert REPO in failure.value.message
    assert not list(cache.rglob(".npu-complete/*.json"))
    hub.faults.corrupt.clear()  # the hub is right again: the next start completes
    snapshot, progress = run_fetch(options(hub, cache, which))
    entry = hub.repos[REPO].files[WEIGHTS]
    assert progress.phase == "Ready"
    assert file_matches(snapshot / WEIGHTS, RemoteFile(WEIGHTS, entry.size, entry.sha256, None))


@pytest.mark.parametrize("which", HUBS)
def test_a_token_the_hub_refuses_is_access_denied(which: str, hub: LocalHub, tmp_path: Path) -> None:
    hub.faults.token = "s3cret-token"
    with pytest.raises(FetchError) as failure:
        run_fetch(options(hub, tmp_path / "cache", which, token="wrong"))
    assert failure.value.reason == ACCESS_DENIED
    assert REPO in failure.value.message and "s3cret" not in failure.value.message
    _, progress = run_fetch(options(hub, tmp_path / "cache", which, token="s3cret-token"))
    assert progress.phase == "Ready"


@pytest.mark.parametrize("which", HUBS)
@pytest.mark.parametrize(("repo_id", "revision"), [(REPO, "no-such-branch"), ("org/missing", None)])
def test_a_missing_repository_or_revision_is_not_found(
    which: str, repo_id: str, revision: str | None, hub: LocalHub, tmp_path: Path
) -> None:
    with pytest.raises(FetchError) as failure:
        run_fetch(options(hub, tmp_path / "cache", which, repo=repo_id, revision=revision))
    assert failure.value.reason == NOT_FOUND
    assert repo_id in failure.value.message


@pytest.mark.parametrize("which", HUBS)
def test_config_json_arrives_before_the_weights(which: str, hub: LocalHub, repo: Repo, tmp_path: Path) -> None:
    seen: list[tuple[set[str], dict[str, int]]] = []
    opts = options(hub, tmp_path / "cache", which)
    progress = Progress(source=opts.hub, repository=opts.repo)
    plan = lambda s: seen.append(({p.name for p in s.iterdir()}, dict(hub.served)))  # noqa: E731
    driver.fetch(opts, fetch.hub_for(opts.hub), progress, on_config=plan)
    assert seen == [({"config.json"}, {f"{REPO}/config.json": 1})]  # planned before any other body was asked for
    assert dict(hub.served) == {f"{REPO}/{name}": 1 for name in repo.files}  # config.json was not fetched again


def _cli(
    hub: LocalHub, cache: Path, *extra: str, token: str | None = None, hub_name: str = HUGGING_FACE
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if token is not None:
        env[fetch.TOKEN_ENV] = token
    return subprocess.Popen(
        [sys.executable, "-m", "npu_runtime.cli", "fetch", "--hub", hub_name, "--repo", REPO,
         "--cache", str(cache), "--endpoint", hub.url, *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_two_replicas_at_once_download_once(hub: LocalHub, repo: Repo, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    replicas = [_cli(hub, cache, "--link", str(tmp_path / f"pod{i}" / "model")) for i in range(2)]
    for replica in replicas:
        _, err = replica.communicate(timeout=120)
        assert replica.returncode == 0, err
    assert {name: hub.served[f"{REPO}/{name}"] for name in repo.files} == dict.fromkeys(repo.files, 1)
    for i in range(2):
        assert (tmp_path / f"pod{i}" / "model" / "config.json").read_bytes() == repo.files["config.json"].data


def test_the_command_names_the_reason_and_never_prints_the_token(hub: LocalHub, tmp_path: Path) -> None:
    hub.faults.token = "s3cret-token"
    message = tmp_path / "termination-log"
    argv = ("--termination-message-path", str(message), "--send-token-over-http")  # the local hub is http://
    replica = _cli(hub, tmp_path / "cache", *argv, token="wrong-s3cret")
    out, err = replica.communicate(timeout=120)
    assert replica.returncode == fetch.EXIT_INVALID
    line = message.read_text().strip()
    assert line.startswith(f"{ACCESS_DENIED}: huggingface {REPO}@main")
    assert "s3cret" not in out + err + line


def test_a_token_goes_to_a_plain_http_endpoint_only_when_asked(hub: LocalHub, tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    replica = _cli(hub, tmp_path / "cache", "--termination-message-path", str(message), token="s3cret")
    out, err = replica.communicate(timeout=120)
    assert replica.returncode == fetch.EXIT_INVALID
    assert message.read_text().startswith(f"InvalidConfiguration: --endpoint {hub.url} is not https://")
    assert not hub.served and "s3cret" not in out + err


def test_status_serves_the_progress(tmp_path: Path) -> None:
    progress = Progress(source="huggingface", repository=REPO, revision="abc", phase="Downloading")
    progress.bytes_done, progress.bytes_total = 41, 100
    server = StatusServer(progress, 0, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/status", timeout=5) as answer:
            body = json.load(answer)
    finally:
        server.close()
    assert body["model"] == {
        "source": "huggingface",
        "repository": REPO,
        "revision": "abc",
        "phase": "Downloading",
        "bytesDone": 41,
        "bytesTotal": 100,
        "filesDone": 0,
        "filesTotal": 0,
    }


def test_a_finished_fetch_leaves_its_result_in_the_termination_message(
    hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    message = tmp_path / "termination-log"
    replica = _cli(hub, tmp_path / "cache", "--termination-message-path", str(message))
    _, err = replica.communicate(timeout=120)
    assert replica.returncode == 0, err
    head, _, payload = message.read_text().strip().partition(": ")
    assert head == fetch.READY
    result = json.loads(payload)
    assert (result["phase"], result["revision"], result["filesDone"]) == ("Ready", repo.commit, len(repo.files))


def test_a_model_that_cannot_fit_stops_before_its_weights(hub: LocalHub, tmp_path: Path) -> None:
    message = tmp_path / "termination-log"
    plan = ["--plan", "--device-kind", "npu", "--device-memory", "1MiB", "--max-model-len", "256"]
    replica = _cli(hub, tmp_path / "cache", "--termination-message-path", str(message), *plan)
    _, err = replica.communicate(timeout=120)
    assert replica.returncode == fetch.EXIT_DOES_NOT_FIT, err
    assert message.read_text().startswith("ModelDoesNotFit: planned from config.json: ")
    assert hub.served[f"{REPO}/config.json"] == 1
    assert hub.served[f"{REPO}/{WEIGHTS}"] == 0  # the weights were never asked for


@pytest.mark.parametrize("which", HUBS)
def test_no_space_left_anywhere_in_the_library_is_cache_full(which: str, hub: LocalHub, tmp_path: Path) -> None:
    # A full disk cannot be provoked here without privileges; the library's wrapped OSError stands in for it.
    wrapped = RuntimeError("download failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    failure = driver._failure(fetch.hub_for(which), wrapped, options(hub, tmp_path, which))
    assert (failure.reason, failure.message) == (
        CACHE_FULL,
        f"{which} {REPO}@{fetch.hub_for(which).default_revision}: no space left on the cache volume",
    )


@pytest.mark.parametrize("which", HUBS)
def test_a_killed_download_is_taken_over_by_the_next_pod(which: str, big_repo: Repo, tmp_path: Path) -> None:
    """The kernel frees a killed holder's lock. ModelScope resumes its `.incomplete` file with a Range
    request; huggingface_hub 1.x downloads to a file unique to the process and never reuses it
    (huggingface_hub#4228), so the next pod removes the orphan and fetches the file again."""
    cache, size = tmp_path / "cache", big_repo.files[BIG].size
    with LocalHub([big_repo]) as hub:
        hub.rate = 8 << 20  # 24 MiB in 3 s: whole chunks are on disk before the kill

        def partial() -> int:
            total = 0
            for path in cache.rglob("*.incomplete") if cache.exists() else ():
                with contextlib.suppress(FileNotFoundError):  # completed (renamed) since it was listed
                    total += path.stat().st_size
            return total

        first = _cli(hub, cache, hub_name=which)
        deadline = time.monotonic() + 60
        # More on disk than any small file holds: a small file's `.incomplete` can exist for a moment
        # and be renamed before the kill (seen on a loaded machine), which left nothing partial.
        small = max(file.size for name, file in big_repo.files.items() if name != BIG)
        while partial() <= small and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        first.kill()  # SIGKILL: no cleanup, the lock is the kernel's to release
        first.communicate(timeout=30)
        kept = partial()
        assert 0 < kept < size
        hub.rate = None
        second = _cli(hub, cache, hub_name=which)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        resumed = [start for path, start in hub.ranges if path == BIG]
        if which == MODEL_SCOPE:
            assert resumed and resumed[-1] > 0  # the next pod asked for the rest only
        else:
            assert resumed == [] and hub.served[f"{REPO}/{BIG}"] == 1  # the body the killed pod cut is not counted
        assert partial() == 0  # no orphan left on the cache volume
