"""Engine releases' published sources, downloaded once into .cache/engine-sources/ (never installed).

Each distribution of `npu_runtime.engines.RELEASES` is fetched from the package index's JSON
simple API (PEP 691, what pip itself reads), its sha256 checked against the index, and only its
Python files unpacked, under `.cache/engine-sources/<name>-<version>/`. The source distribution
is preferred (vLLM's is 37 MB, its wheels 270 MB); a release without one gives its smallest wheel
(the Python files of every platform's wheel are the same).

Not `pip download`: for a source distribution pip prepares its metadata by building it, and
vllm-ascend 0.23.0.post1 (published as a source distribution only) cannot be built without CANN.

    python -m tests.compat.sources      # fetch every release now (CI does it in the test itself)

NPU_COMPAT_INDEX_URL points at another index serving the same JSON API (a mirror); the default is
https://pypi.org/simple. About 115 MB are downloaded on a cold cache, a few seconds on CI's link.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Final

from npu_runtime.engines import RELEASES

ROOT: Final = Path(__file__).resolve().parents[2]
CACHE: Final = ROOT / ".cache" / "engine-sources"
INDEX_URL: Final = os.environ.get("NPU_COMPAT_INDEX_URL", "https://pypi.org/simple").rstrip("/")
TIMEOUT_SECONDS: Final = 120
DONE_MARK: Final = ".complete"
PACKAGES: Final = ("vllm", "vllm_ascend")  # the import packages kept from a distribution


class SourceUnavailable(Exception):
    """The index cannot be reached or has no file for the release."""


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def source_dir(name: str, version: str) -> Path:
    return CACHE / f"{normalise(name)}-{version}"


def cached(name: str, version: str) -> Path | None:
    directory = source_dir(name, version)
    return directory if (directory / DONE_MARK).exists() else None


def _index_files(name: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        f"{INDEX_URL}/{normalise(name)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            files: list[dict[str, Any]] = json.load(response)["files"]
    except Exception as exc:
        raise SourceUnavailable(f"{INDEX_URL}/{normalise(name)}/: {exc}") from exc
    return files


def latest_version(name: str) -> str | None:
    """The newest final release of `name` on the index (None when the index cannot be read)."""
    from packaging.version import InvalidVersion, Version

    versions: set[Version] = set()
    try:
        files = _index_files(name)
    except SourceUnavailable:
        return None
    prefix = name.replace("-", "_").lower()
    for entry in files:
        filename = str(entry["filename"])
        stem = filename.removesuffix(".tar.gz")
        parts = stem.split("-")
        if parts[0].replace("-", "_").lower() != prefix or len(parts) < 2:
            continue
        try:
            version = Version(parts[1])
        except InvalidVersion:
            continue
        if not version.is_prerelease and not entry.get("yanked"):
            versions.add(version)
    return str(max(versions)) if versions else None


def _pick(name: str, version: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    prefix = f"{name.replace('-', '_').lower()}-{version}"
    sdists = [f for f in files if str(f["filename"]).lower() == f"{prefix}.tar.gz"]
    if sdists:
        return sdists[0]
    wheels = [
        f for f in files if str(f["filename"]).lower().startswith(prefix + "-") and f["filename"].endswith(".whl")
    ]
    if not wheels:
        raise SourceUnavailable(f"{name} {version}: no source distribution or wheel on {INDEX_URL}")
    return min(wheels, key=lambda f: int(f.get("size") or 0))


def _members(archive: bytes, filename: str) -> list[tuple[str, bytes]]:
    """(path inside an import package, content) of every .py file in the archive."""
    found: list[tuple[str, bytes]] = []
    if filename.endswith(".whl"):
        with zipfile.ZipFile(io.BytesIO(archive)) as wheel:
            for member in wheel.namelist():
                if member.endswith(".py") and member.split("/", 1)[0] in PACKAGES:
                    found.append((member, wheel.read(member)))
        return found
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as sdist:
        for info in sdist.getmembers():
            parts = info.name.split("/", 2)  # <name>-<version>/<package>/...
            if info.isfile() and info.name.endswith(".py") and len(parts) == 3 and parts[1] in PACKAGES:
                handle = sdist.extractfile(info)
                if handle is not None:
                    found.append(("/".join(parts[1:]), handle.read()))
    return found


def fetch(name: str, version: str) -> Path:
    """The unpacked Python sources of `name==version` (downloaded on the first call)."""
    hit = cached(name, version)
    if hit is not None:
        return hit
    entry = _pick(name, version, _index_files(name))
    try:
        with urllib.request.urlopen(str(entry["url"]), timeout=TIMEOUT_SECONDS) as response:
            archive = response.read()
    except Exception as exc:
        raise SourceUnavailable(f"{entry['filename']}: {exc}") from exc
    expected = (entry.get("hashes") or {}).get("sha256")
    if expected and hashlib.sha256(archive).hexdigest() != expected:
        raise SourceUnavailable(f"{entry['filename']}: sha256 does not match the index")
    directory = source_dir(name, version)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for path, content in _members(archive, str(entry["filename"])):
        target = partial / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    (partial / DONE_MARK).write_text(f"{entry['filename']} sha256={expected}\n", encoding="utf-8")
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    return directory


def main() -> int:
    for release in RELEASES:
        for name, version in release.distributions:
            print(f"{name} {version}: {fetch(name, version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
