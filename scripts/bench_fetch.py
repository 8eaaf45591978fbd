#!/usr/bin/env python3
"""Download throughput from the local hub: `npu-runtime fetch` versus the hub client's own download.

    python scripts/bench_fetch.py [--size-mib 512] [--shards 4] [--runs 3] [--hub huggingface|modelscope] [--pinned]
        [--hub-nagle]

One local hub (npu_sandbox.fixtures.local_hub, 127.0.0.1, with TCP_NODELAY) serves a repository of
--shards random safetensors shards (--size-mib in all) plus config.json. In the same run, each round downloads
the same files into fresh directories (plain and fetch in alternating order, after `sync`), at the
repository's default branch, or with --pinned at the commit it points at (what every pod after a
rollout's first asks for: the operator pins the commit the first pod resolved):

- plain:  `huggingface_hub.snapshot_download(repo, cache_dir=..., endpoint=...)` (or ModelScope's),
          nothing else;
- fetch:  `npu_runtime.fetch.driver.fetch(...)`, the init container's work in process: resolve the
          revision, take the cache's lock, download with the library (config.json first), every
          file verified (hashed while it streams, or by the client against the listing, else from
          disk after), write the marker and progress file;
- cached: `fetch` again on the complete cache (what every other replica and resource pays);
- plain, 1 MiB (huggingface_hub only): the library's download with the read chunk fetch sets for
          it (huggingface.py says why), which prices the hash by itself.

It prints the median seconds, MB/s and CPU seconds (the process's: the client and the local hub
in it) of each; fetch's speed relative to plain (the ratio of the medians, and the median of each
round's ratio, which a noisy machine disturbs less); the bytes that had to be hashed from disk
instead (0 when every file was verified as it arrived); and the machine's load average
before and after.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "sandbox")]

from npu_runtime.fetch import disk, driver, huggingface  # noqa: E402
from npu_runtime.fetch import download as fetch  # noqa: E402
from npu_runtime.fetch.hub import HUBS, HUGGING_FACE, FetchOptions  # noqa: E402
from npu_runtime.fetch.progress import Progress  # noqa: E402
from npu_sandbox.fixtures import local_hub  # noqa: E402
from npu_sandbox.fixtures.local_hub import LocalHub, Repo  # noqa: E402

REPO = "bench/random-model"
LIBRARY_CHUNK: list[int] = []  # huggingface_hub's constants.DOWNLOAD_CHUNK_SIZE before any fetch set it


def make_repo(directory: Path, size_mib: int, shards: int) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}\n')
    rng = random.Random(11)
    for index in range(shards):
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        (directory / name).write_bytes(rng.randbytes((size_mib << 20) // shards))


def plain(hub: str, endpoint: str, cache: Path, revision: str | None, chunk: int | None = None) -> None:
    if hub == HUGGING_FACE:
        from huggingface_hub import constants, snapshot_download

        # fetch sets the library's write chunk for the process; plain gets the library's own (or `chunk`).
        constants.DOWNLOAD_CHUNK_SIZE = chunk or LIBRARY_CHUNK[0]
        snapshot_download(REPO, revision=revision, cache_dir=cache, endpoint=endpoint, token=False)
    else:
        # What `modelscope.snapshot_download` calls (modelscope >= 1.40 is a shim), as fetch does.
        from modelscope_hub.compat.snapshot_download import snapshot_download as ms_snapshot_download

        ms_snapshot_download(repo_id=REPO, revision=revision, cache_dir=str(cache), endpoint=endpoint)


def fetched(hub: str, endpoint: str, cache: Path, revision: str | None) -> Path:
    options = FetchOptions(hub=hub, repo=REPO, revision=revision, cache=cache, endpoint=endpoint)
    progress = Progress(source=hub, repository=REPO)
    return driver.fetch(options, fetch.hub_for(hub), progress, on_config=lambda _: None)


CPU: dict[str, list[float]] = {}  # name -> CPU seconds of the process (client and in-process hub) per run


def timed(action: object, name: str = "") -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    action()  # type: ignore[operator]
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    CPU.setdefault(name, []).append(after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime)
    return elapsed


def load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hub", choices=HUBS, default=HUGGING_FACE)
    parser.add_argument("--pinned", action="store_true", help="download the commit, not the default branch")
    parser.add_argument(
        "--hub-nagle", action="store_true", help="leave Nagle's algorithm on the local hub's sockets (40 ms a request)"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # The local hub answers headers and body in two writes; with Nagle's algorithm on its socket and
    # delayed ACKs on the client's, every request would wait 40 ms for nothing (a hub's web server
    # sets TCP_NODELAY). Off, so that what is timed is the download, not the request count.
    local_hub._Handler.disable_nagle_algorithm = not args.hub_nagle
    from huggingface_hub import constants

    LIBRARY_CHUNK.append(constants.DOWNLOAD_CHUNK_SIZE)
    hashed_from_disk: list[int] = []
    from_disk = disk._hash_one

    def counted(snapshot: Path, remote: Any, verification: Any) -> bool:
        hashed_from_disk.append(remote.size)
        return from_disk(snapshot, remote, verification)

    disk._hash_one = counted
    work = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
    load_before = load()
    try:
        make_repo(work / "repo", args.size_mib, args.shards)
        repo = Repo.from_directory(REPO, work / "repo")
        total = sum(f.size for f in repo.files.values())
        times: dict[str, list[float]] = {"plain": [], "fetch": [], "cached": []}
        # huggingface_hub: also its own download with the write chunk fetch sets (huggingface.py says why),
        # which prices the hash alone.
        same_chunk = f"plain, {huggingface._HF_WRITE_CHUNK >> 20} MiB"
        if args.hub == HUGGING_FACE:
            times[same_chunk] = []
        revision = repo.commit if args.pinned else None
        with LocalHub([repo]) as hub:
            for run in range(args.runs):
                plain_cache, fetch_cache = work / f"plain-{run}", work / f"fetch-{run}"
                # Alternating order, each after the disk has written back the last one's pages.
                order = ["plain", "fetch"] if run % 2 == 0 else ["fetch", "plain"]
                if same_chunk in times:
                    order.insert(1, same_chunk)
                for name in order:
                    os.sync()
                    if name == "plain":
                        times["plain"].append(timed(lambda c=plain_cache: plain(args.hub, hub.url, c, revision), name))
                    elif name == same_chunk:
                        other = work / f"chunked-{run}"
                        chunk = huggingface._HF_WRITE_CHUNK
                        times[name].append(
                            timed(lambda c=other, n=chunk: plain(args.hub, hub.url, c, revision, n), name)
                        )
                        shutil.rmtree(other)
                    else:
                        times["fetch"].append(
                            timed(lambda c=fetch_cache: fetched(args.hub, hub.url, c, revision), name)
                        )
                times["cached"].append(timed(lambda c=fetch_cache: fetched(args.hub, hub.url, c, revision), "cached"))
                shutil.rmtree(plain_cache)
                shutil.rmtree(fetch_cache)
            served = dict(hub.served)
        print(
            f"hub {args.hub}: {len(repo.files)} files, {total / 1e6:.0f} MB"
            f" at {'the commit' if args.pinned else 'the branch'}, {args.runs} runs, local hub on 127.0.0.1"
            f"{' (Nagle on)' if args.hub_nagle else ''}; load average {load_before} before, {load()} after"
            f" ({os.cpu_count()} CPUs)"
        )
        print(f"{'':14}{'median s':>10}{'MB/s':>10}{'CPU s':>10}")
        for name, values in times.items():
            median = statistics.median(values)
            rate = f"{total / 1e6 / median:10.0f}" if name != "cached" else f"{'':>10}"
            print(f"{name:14}{median:10.3f}{rate}{statistics.median(CPU[name]):10.2f}")
        plain_median, fetch_median = statistics.median(times["plain"]), statistics.median(times["fetch"])
        rounds = [p / f for p, f in zip(times["plain"], times["fetch"], strict=True)]
        print(
            f"fetch speed / plain speed: {plain_median / fetch_median:.2f}x (medians),"
            f" {statistics.median(rounds):.2f}x (median of the rounds: {', '.join(f'{r:.2f}' for r in rounds)})"
        )
        if same_chunk in times:
            chunked = statistics.median(times[same_chunk])
            print(f"fetch speed / {same_chunk} speed: {chunked / fetch_median:.2f}x (medians): the hash's own price")
        print(f"hashed from disk (not as they streamed): {sum(hashed_from_disk)} bytes")
        per_file = sorted(set(served.values()))
        print(f"file bodies served per file over all runs: {per_file} (one per download and run; cached: 0)")
    finally:
        disk._hash_one = from_disk
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
