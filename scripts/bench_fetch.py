#!/usr/bin/env python3
"""Download throughput from the local hub: `npu-runtime fetch` versus a plain snapshot_download.

    python scripts/bench_fetch.py [--size-mib 512] [--shards 4] [--runs 3] [--hub huggingface|modelscope]

One local hub (npu_sandbox.fixtures.local_hub, 127.0.0.1) serves a repository of --shards random
safetensors shards (--size-mib in all) plus config.json. In the same run, each round downloads
the same files into fresh directories (plain and fetch in alternating order, after `sync`):

- plain:  `huggingface_hub.snapshot_download(repo, cache_dir=..., endpoint=...)` (or ModelScope's),
          nothing else;
- fetch:  `npu_runtime.fetch.download.fetch(...)`, the init container's work in process: resolve the
          revision, take the cache's lock, download with the same library call (config.json
          first), check every file's size and hash, write the marker and progress file;
- cached: `fetch` again on the complete cache (what every other replica and resource pays).

It prints the median seconds and MB/s of each, and the overhead of fetch over plain, split into
the hash check (timed separately on the downloaded files) and the rest (lock, listing, marker).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "runtime"), str(ROOT / "sandbox")]

from npu_runtime.fetch import download as fetch  # noqa: E402
from npu_sandbox.fixtures.local_hub import LocalHub, Repo  # noqa: E402

REPO = "bench/random-model"


def make_repo(directory: Path, size_mib: int, shards: int) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}\n')
    rng = random.Random(11)
    for index in range(shards):
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        (directory / name).write_bytes(rng.randbytes((size_mib << 20) // shards))


def plain(hub: str, endpoint: str, cache: Path) -> None:
    if hub == fetch.HUGGING_FACE:
        from huggingface_hub import snapshot_download

        snapshot_download(REPO, cache_dir=cache, endpoint=endpoint, token=False)
    else:
        # What `modelscope.snapshot_download` calls (modelscope >= 1.40 is a shim), as fetch does.
        from modelscope_hub.compat.snapshot_download import snapshot_download as ms_snapshot_download

        ms_snapshot_download(repo_id=REPO, cache_dir=str(cache), endpoint=endpoint)


def fetched(hub: str, endpoint: str, cache: Path) -> Path:
    options = fetch.FetchOptions(hub=hub, repo=REPO, revision=None, cache=cache, endpoint=endpoint)
    progress = fetch.Progress(source=hub, repository=REPO)
    return fetch.fetch(options, fetch.hub_for(hub), progress, on_config=lambda _: None)


def timed(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hub", choices=fetch.HUBS, default=fetch.HUGGING_FACE)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    work = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
    try:
        make_repo(work / "repo", args.size_mib, args.shards)
        repo = Repo.from_directory(REPO, work / "repo")
        total = sum(f.size for f in repo.files.values())
        times: dict[str, list[float]] = {"plain": [], "fetch": [], "cached": [], "hash check": []}
        with LocalHub([repo]) as hub:
            for run in range(args.runs):
                plain_cache, fetch_cache = work / f"plain-{run}", work / f"fetch-{run}"
                # Alternating order, each after the disk has written back the last one's pages.
                order = ["plain", "fetch"] if run % 2 == 0 else ["fetch", "plain"]
                for name in order:
                    os.sync()
                    if name == "plain":
                        times["plain"].append(timed(lambda c=plain_cache: plain(args.hub, hub.url, c)))
                    else:
                        times["fetch"].append(timed(lambda c=fetch_cache: fetched(args.hub, hub.url, c)))
                snapshot = fetched(args.hub, hub.url, fetch_cache)  # cached: the path only
                times["cached"].append(timed(lambda c=fetch_cache: fetched(args.hub, hub.url, c)))
                listing = fetch.Listing(
                    "x", tuple(fetch.RemoteFile(f.path, f.size, f.sha256, None) for f in repo.files.values())
                )
                times["hash check"].append(timed(lambda s=snapshot, li=listing: fetch._mismatched(s, li)))
                shutil.rmtree(plain_cache)
                shutil.rmtree(fetch_cache)
            served = dict(hub.served)
        print(
            f"hub {args.hub}: {len(repo.files)} files, {total / 1e6:.0f} MB, {args.runs} runs, local hub on 127.0.0.1"
        )
        print(f"{'':12}{'median s':>10}{'MB/s':>10}")
        for name, values in times.items():
            median = statistics.median(values)
            rate = f"{total / 1e6 / median:10.0f}" if name in ("plain", "fetch") else f"{'':>10}"
            print(f"{name:12}{median:10.3f}{rate}")
        overhead = statistics.median(times["fetch"]) - statistics.median(times["plain"])
        hashing = statistics.median(times["hash check"])
        print(
            f"fetch - plain: {overhead:+.3f} s ({overhead / statistics.median(times['plain']) * 100:+.1f}%), "
            f"of which the hash check {hashing:.3f} s and the rest (lock, listing, config first, marker) "
            f"{overhead - hashing:+.3f} s"
        )
        per_file = set(served.values())
        print(f"file bodies served per file over all runs: {sorted(per_file)} (2 per run: plain + fetch; cached: 0)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
