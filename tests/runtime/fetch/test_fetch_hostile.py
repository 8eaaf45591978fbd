"""`npu-runtime fetch` against a hostile hub: nothing outside the cache is written, deleted or linked.

The hub double is npu_sandbox.fixtures.local_hub with its hostile faults (a commit that is a path, listed
paths outside the repository, wrong and endless sizes, extra files, moving branches), in both
hubs' API shapes; the fetch is the command itself (`fetch_command`, what `npu-runtime fetch`
runs) with the real huggingface_hub and modelscope clients, in a temporary directory whose
every entry outside the cache is compared before and after.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import filelock
import pytest
from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import NPUInferenceSpec, parse_spec
from npu_operator.children import engine_pod as builders
from npu_operator.kube.names import FETCH_CONTAINER_NAME
from npu_operator.status import revisions
from npu_operator.status.findings import PodReport
from npu_operator.status.reports import parse_report
from npu_runtime.fetch import download as fetch
from npu_runtime.fetch import layout
from npu_runtime.fetch.hub import DOWNLOAD_FAILED, HASH_MISMATCH, HUGGING_FACE, MODEL_SCOPE
from npu_runtime.serving import failures
from npu_sandbox.fixtures.local_hub import LocalHub, Repo, RepoFile
from npu_sandbox.node.network import free_port

from tests.examples import example
from tests.runtime.conftest import HUBS, REPO, WEIGHTS

pytestmark = pytest.mark.usefixtures("quiet_hub_clients")


def changed(repo: Repo, files: dict[str, bytes], drop: tuple[str, ...] = ()) -> Repo:
    """`repo` with some files replaced or added (a new commit, as Repo.from_directory would make)."""
    entries = {path: f for path, f in repo.files.items() if path not in drop}
    for path, data in files.items():
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entries[path] = RepoFile(path, len(data), blob, hashlib.sha256(data).hexdigest(), data)
    commit = hashlib.sha1("".join(f.path + f.sha1 for f in entries.values()).encode()).hexdigest()
    return Repo(repo.repo_id, commit, entries)


class Volume:
    """A temporary directory with the cache inside and sentinel files beside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache = root / "cache"
        self.outside = root / "outside"
        self.outside.mkdir(parents=True)
        (self.outside / "victim.txt").write_text("keep me\n")
        (self.outside / "config.json").write_text('{"keep": "me"}\n')
        self.before = self.state()

    def state(self) -> dict[str, tuple[str, str]]:
        """Every entry outside the cache: what it is and its content (a link's target)."""
        found: dict[str, tuple[str, str]] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            if here == self.cache:
                dirnames.clear()
                continue
            for name in dirnames + filenames:
                path = here / name
                key = str(path.relative_to(self.root))
                if key in ("cache", "message", "hf-home", "ms-home") or key.startswith(("hf-home/", "ms-home/")):
                    continue
                if path.is_symlink():
                    found[key] = ("link", os.readlink(path))
                elif path.is_file():
                    found[key] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
                else:
                    found[key] = ("dir", "")
        return found

    def assert_untouched(self) -> None:
        assert self.state() == self.before
        for dirpath, dirnames, filenames in os.walk(self.cache):  # and nothing in the cache leads out
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                if path.is_symlink():
                    assert os.path.realpath(path).startswith(str(self.cache.resolve()) + os.sep), path


def run(volume: Volume, hub: LocalHub, which: str, *args: str) -> tuple[int, str]:
    """`npu-runtime fetch` as the init container runs it; (exit code, termination message)."""
    message = volume.root / "message"
    argv = ["--hub", which, "--repo", REPO, "--cache", str(volume.cache), "--endpoint", hub.url]
    code = fetch.fetch_command([*argv, "--termination-message-path", str(message), *args])
    return code, message.read_text() if message.exists() else ""


@pytest.mark.parametrize("which", HUBS)
def test_a_revision_that_names_a_variable_or_climbs_out_is_refused_before_any_request(
    which: str, hub: LocalHub, tmp_path: Path
) -> None:
    volume = Volume(tmp_path)
    for revision in ("$(NPU_MODEL_TOKEN)", "../../../../../../outside/x", "main/../../x", "/abs"):
        code, message = run(volume, hub, which, "--revision", revision)
        assert code == fetch.EXIT_INVALID
        assert message.startswith(f"{failures.INVALID_CONFIGURATION}: --revision"), message
    assert not hub.served and not hub.ranges
    volume.assert_untouched()


@pytest.mark.parametrize("which", HUBS)
def test_a_commit_that_is_a_path_is_refused(which: str, hub: LocalHub, tmp_path: Path) -> None:
    volume = Volume(tmp_path)
    hub.faults.commit = "../../../../../outside/x"
    code, message = run(volume, hub, which)
    assert code == fetch.EXIT_FAILED
    assert message.startswith(f"{DOWNLOAD_FAILED}: ") and "not a commit id" in message, message
    assert not hub.served
    volume.assert_untouched()


@pytest.mark.parametrize("which", HUBS)
@pytest.mark.parametrize("listed", ["absolute", "climbing", "dot-segment"])
def test_listed_paths_outside_the_repository_are_refused(
    which: str, listed: str, hub: LocalHub, tmp_path: Path
) -> None:
    volume = Volume(tmp_path)
    path = {
        "absolute": str(volume.outside / "victim.txt"),
        "climbing": "../../../../../../../outside/victim.txt",
        "dot-segment": "a/./config.json",
    }[listed]
    # A wrong size too: a fetch that compared sizes before checking paths would "clean up" the file.
    hub.faults.listed.append({"path": path, "size": 3})
    code, message = run(volume, hub, which)
    assert code == fetch.EXIT_FAILED
    assert "not a relative path inside the repository" in message, message
    assert not hub.served
    volume.assert_untouched()
    assert (volume.outside / "victim.txt").read_text() == "keep me\n"


@pytest.mark.parametrize("which", HUBS)
@pytest.mark.parametrize("fault", ["endless", "longer than listed"])
def test_a_body_stops_at_its_listed_size(which: str, fault: str, hub: LocalHub, repo: Repo, tmp_path: Path) -> None:
    volume = Volume(tmp_path)
    size = repo.files[WEIGHTS].size
    if fault == "endless":
        hub.faults.endless.add(WEIGHTS)
    else:
        hub.faults.listed_sizes[WEIGHTS] = size - 4096
    code, message = run(volume, hub, which)
    assert code == fetch.EXIT_FAILED
    assert message.startswith(HASH_MISMATCH), message
    # What the client read before stopping: the listed size plus what the sockets had buffered,
    # never the 256 MiB an endless body offers.
    assert hub.bytes_served < size + (16 << 20)
    on_disk = sum(p.stat().st_size for p in volume.cache.rglob("*") if p.is_file() and not p.is_symlink())
    assert on_disk < 2 * size + (1 << 20)
    assert not list(volume.cache.rglob(".npu-complete/*.json"))
    volume.assert_untouched()


@pytest.mark.parametrize("which", HUBS)
@pytest.mark.parametrize("attack", ["extra files", "missing files"])
def test_a_tenants_endpoint_cannot_poison_anothers_model(
    which: str, attack: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    """Two resources on one cache: the attacker names its own endpoint, the victim's repository id
    and the victim's real commit, and serves the real files plus extras (or an incomplete tree)."""
    if attack == "extra files":
        extras = {"chat_template.jinja": b"{{ 'pwned' }}", "generation_config.json": b'{"temperature": 9}'}
        forged = changed(repo, extras)
    else:
        forged = changed(repo, {}, drop=(WEIGHTS,))
    forged = Repo(repo.repo_id, repo.commit, forged.files)  # the victim's commit id, the attacker's files
    volume = Volume(tmp_path)
    with LocalHub([forged]) as attacker:
        code, message = run(volume, attacker, which, "--link", str(tmp_path / "attacker-pod" / "model"))
        assert code == fetch.EXIT_OK, message
    code, message = run(volume, hub, which, "--link", str(tmp_path / "victim-pod" / "model"))
    assert code == fetch.EXIT_OK, message
    model = (tmp_path / "victim-pod" / "model").resolve()
    served = sorted(str(p.relative_to(model)) for p in model.rglob("*") if p.is_file())
    assert served == sorted(repo.files)  # no extra file, none missing
    for name, remote in repo.files.items():
        assert (model / name).read_bytes() == remote.data
    assert model != (tmp_path / "attacker-pod" / "model").resolve()


@pytest.mark.parametrize("which", HUBS)
def test_a_completion_marker_is_not_trusted_without_the_files(
    which: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    volume = Volume(tmp_path)
    link = tmp_path / "pod" / "model"
    assert run(volume, hub, which, "--link", str(link))[0] == fetch.EXIT_OK
    for path in volume.cache.rglob("*"):  # the weights vanish (a cleanup, a full disk), the marker stays
        if path.name == WEIGHTS or (path.is_file() and path.stat().st_size == repo.files[WEIGHTS].size):
            path.unlink()
    assert list(volume.cache.rglob(".npu-complete/*.json"))
    code, message = run(volume, hub, which, "--link", str(link))
    assert code == fetch.EXIT_OK, message
    assert (link / WEIGHTS).read_bytes() == repo.files[WEIGHTS].data
    assert hub.served[f"{REPO}/{WEIGHTS}"] == 2


@pytest.mark.parametrize("which", HUBS)
def test_a_moving_branch_never_rewrites_a_running_replicas_snapshot(
    which: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    volume = Volume(tmp_path)
    first, second = tmp_path / "pod0" / "model", tmp_path / "pod1" / "model"
    assert run(volume, hub, which, "--link", str(first))[0] == fetch.EXIT_OK
    moved = changed(repo, {"config.json": repo.files["config.json"].data.replace(b"{", b'{"moved": 1, ', 1)})
    hub.push(moved)  # the branch moves while pod0 serves
    code, message = run(volume, hub, which, "--link", str(second))
    assert code == fetch.EXIT_OK, message
    assert (first / "config.json").read_bytes() == repo.files["config.json"].data  # pod0's files did not change
    assert (second / "config.json").read_bytes() == moved.files["config.json"].data
    assert first.resolve().name == repo.commit and second.resolve().name == moved.commit
    assert message.startswith(fetch.READY) and f'"revision": "{moved.commit}"' in message  # the status's revision


@pytest.mark.parametrize("which", HUBS)
def test_other_bytes_under_a_commit_the_snapshot_holds_never_rewrite_it(
    which: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    """Issue 33, item 17: the hub answers other bytes under the very commit a running replica links
    (a rewritten history, a hostile mirror). The snapshot is not touched; the fetch fails clearly."""
    volume = Volume(tmp_path)
    first, second = tmp_path / "pod0" / "model", tmp_path / "pod1" / "model"
    assert run(volume, hub, which, "--link", str(first))[0] == fetch.EXIT_OK
    forged = changed(repo, {WEIGHTS: b"forged " + repo.files[WEIGHTS].data[7:]})
    hub.push(dataclasses.replace(forged, commit=repo.commit))  # same commit, other bytes
    code, message = run(volume, hub, which, "--link", str(second))
    assert code != fetch.EXIT_OK
    assert message.startswith(HASH_MISMATCH) and repo.commit in message and WEIGHTS in message, message
    assert (first / WEIGHTS).read_bytes() == repo.files[WEIGHTS].data  # pod0's files did not change
    assert hub.served.get(f"{REPO}/{WEIGHTS}") == 1  # nothing was downloaded again
    assert not second.exists()


@pytest.mark.parametrize("which", HUBS)
def test_a_branch_that_moves_between_replicas_of_a_rollout_is_served_at_one_commit(
    which: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    """The rollout's first pod (`fetch --hold`, from the operator's template) resolves the branch and says
    which commit on /status; the operator pins it (revisions.resolve); the branch moves; the next replica,
    fetching with the pinned template's args, serves the first pod's commit, not the branch's new one."""
    volume = Volume(tmp_path)
    spec = hub_spec(which)
    resolving = revisions.rollout({}, spec, [])
    assert resolving is not None and resolving.commit is None
    first_args = builders.fetch_args(revisions.for_rollout(spec, resolving))
    revision = first_args[first_args.index("--revision") + 1] if "--revision" in first_args else None
    assert "--hold" in first_args and revision is None  # the hub's main branch
    port, first = free_port(), tmp_path / "pod0" / "model"
    argv = ["--hub", which, "--repo", REPO, "--cache", str(volume.cache), "--endpoint", hub.url, "--hold"]
    argv += ["--link", str(first), "--status-port", str(port), "--termination-message-path", str(tmp_path / "m0")]
    log = (tmp_path / "pod0.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "npu_runtime.cli", "fetch", *argv], stdout=log, stderr=log)
    try:
        report = _ready_status(f"http://127.0.0.1:{port}/status", process)
        assert process.poll() is None  # it holds: no engine starts on a commit only this pod resolved
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
    pod0 = {"metadata": {"name": "pod0", "labels": {revisions.ROLLOUT_LABEL: resolving.key}}, "status": {}}
    reports = [PodReport("pod0", parse_report(report))]
    decided = revisions.resolve(resolving, REPO, [pod0], reports, None, "2026-12-03T12:00:00Z")
    assert decided.problem is None and decided.resolved is not None
    commit = decided.resolved["commit"]
    assert commit == repo.commit

    moved = changed(repo, {"config.json": repo.files["config.json"].data.replace(b"{", b'{"moved": 1, ', 1)})
    hub.push(moved)  # the branch moves between the replicas
    pinned = builders.fetch_args(revisions.for_rollout(spec, dataclasses.replace(resolving, commit=commit)))
    assert pinned[pinned.index("--revision") + 1] == commit and "--hold" not in pinned
    second = tmp_path / "pod1" / "model"
    code, message = run(volume, hub, which, "--revision", commit, "--link", str(second))
    assert code == fetch.EXIT_OK, message
    assert second.resolve().name == first.resolve().name == repo.commit  # both replicas serve one commit
    assert (
        (second / "config.json").read_bytes() == (first / "config.json").read_bytes() == repo.files["config.json"].data
    )
    # Without the pin, a replica created now would have served the branch's new commit.
    assert run(volume, hub, which, "--link", str(tmp_path / "unpinned" / "model"))[1].count(moved.commit) == 1


def hub_spec(which: str) -> NPUInferenceSpec:
    """An NPUInference spec whose source is the repository on `which` (its main branch)."""
    manifest = example("qwen2.5-7b-modelscope.yaml")
    field = {HUGGING_FACE: "huggingFace", MODEL_SCOPE: "modelScope"}[which]
    manifest["spec"]["model"]["source"] = {field: {"repository": REPO}}
    return parse_spec(manifest["spec"])


@pytest.mark.parametrize("which", HUBS)
def test_the_fetch_containers_log_carries_no_progress_bar(which: str, hub: LocalHub, tmp_path: Path) -> None:
    """The operator's fetch container environment keeps both clients' progress bars (carriage returns,
    a line per redraw) out of the init container's log: its progress is status.model."""
    pod_spec = builders.pod_template("qwen", hub_spec(which), OperatorConfig())["spec"]
    (container,) = (c for c in pod_spec["initContainers"] if c["name"] == FETCH_CONTAINER_NAME)
    pod_env = {var["name"]: var["value"] for var in container["env"] if "value" in var}

    def log(run: str, env: dict[str, str]) -> str:
        quiet = ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")  # what the tests' own environment sets
        base = {k: v for k, v in os.environ.items() if k not in quiet}
        argv = ["--hub", which, "--repo", REPO, "--cache", str(tmp_path / run), "--endpoint", hub.url]
        done = subprocess.run(
            [sys.executable, "-m", "npu_runtime.cli", "fetch", *argv],
            env={**base, "PYTHONPATH": os.pathsep.join(sys.path), **env},
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return done.stderr

    assert "%|" in log("bare", {})  # the clients draw bars by default: the check below can fail
    assert "%|" not in log("pod", pod_env)


def _ready_status(url: str, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The /status of a holding fetch once its download is Ready (what the operator polls)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, "the holding fetch exited"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                document: dict[str, Any] = json.loads(answer.read())
            if (document.get("model") or {}).get("phase") == "Ready":
                return document
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no Ready /status at {url}")


@pytest.mark.parametrize("which", HUBS)
def test_two_commits_of_one_repository_download_one_after_the_other(
    which: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    """The blobs are per repository: another commit's download waits instead of removing partial files."""
    volume = Volume(tmp_path)
    other = changed(repo, {"extra.safetensors": os.urandom(1 << 20)})
    hub.tag(other, "other")
    hub.rate = 1 << 20  # about two seconds for the first commit's weights
    results: dict[str, tuple[int, str]] = {}

    def first() -> None:
        results["first"] = run(volume, hub, which, "--revision", repo.commit, "--link", str(tmp_path / "a" / "m"))

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(1.0)
    results["second"] = run(volume, hub, which, "--revision", "other", "--link", str(tmp_path / "b" / "m"))
    thread.join(timeout=120)
    assert results["first"][0] == fetch.EXIT_OK, results["first"][1]
    assert results["second"][0] == fetch.EXIT_OK, results["second"][1]
    assert (tmp_path / "b" / "m" / "extra.safetensors").read_bytes() == other.files["extra.safetensors"].data


@pytest.mark.parametrize("which", HUBS)
def test_file_names_with_glob_characters_download(which: str, repo: Repo, tmp_path: Path) -> None:
    special = changed(repo, {"special_tokens[1].json": b'{"a": 1}', "what?.txt": b"?", "star*.txt": b"*"})
    volume = Volume(tmp_path)
    with LocalHub([special]) as hub:
        code, message = run(volume, hub, which, "--link", str(tmp_path / "pod" / "model"))
    assert code == fetch.EXIT_OK, message
    for name in ("special_tokens[1].json", "what?.txt", "star*.txt"):
        assert (tmp_path / "pod" / "model" / name).read_bytes() == special.files[name].data


@pytest.mark.parametrize("which", HUBS)
def test_revisions_with_dots_have_locks_and_progress_of_their_own(
    which: str, hub: LocalHub, repo: Repo, tmp_path: Path
) -> None:
    volume = Volume(tmp_path)
    newer = changed(repo, {"README.md": b"v1.1\n"})
    hub.tag(repo, "v1.0")
    hub.tag(newer, "v1.1")
    for tag in ("v1.0", "v1.1"):
        code, message = run(volume, hub, which, "--revision", tag, "--link", str(tmp_path / tag / "model"))
        assert code == fetch.EXIT_OK, message
    locks = layout.lock_dir(volume.cache, which, hub.url)
    assert sorted(p.name for p in locks.glob("*.progress.json")) == sorted(
        f"org--tiny-llama@{commit}.progress.json" for commit in (repo.commit, newer.commit)
    )
    assert (tmp_path / "v1.1" / "model" / "README.md").read_bytes() == b"v1.1\n"
    assert not (tmp_path / "v1.0" / "model" / "README.md").exists()


@pytest.mark.parametrize("which", HUBS)
def test_a_waiter_gives_up_when_the_lock_holder_makes_no_progress(which: str, hub: LocalHub, tmp_path: Path) -> None:
    volume = Volume(tmp_path)
    path = layout.lock_file(volume.cache, which, hub.url, REPO)
    path.parent.mkdir(parents=True)
    holder = filelock.FileLock(str(path))
    holder.acquire()  # a download that hangs: it holds the lock and never writes progress
    try:
        started = time.monotonic()
        code, message = run(volume, hub, which, "--lock-timeout", "2")
        assert time.monotonic() - started < 30
    finally:
        holder.release()
    assert code == fetch.EXIT_FAILED
    assert message.startswith(DOWNLOAD_FAILED) and "has not progressed for 2s" in message, message
