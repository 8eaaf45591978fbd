"""Where a fetch keeps things on the shared cache volume, keyed so that trust never crosses endpoints.

    <cache>/<hub>/<endpoint key>/...                         the hub library's own cache (its
                                                             blobs, snapshots, tree listings)
    <cache>/.npu/locks/<hub>/<endpoint key>/<owner>--<name>.lock            one per repository
    <cache>/.npu/locks/<hub>/<endpoint key>/<owner>--<name>@<commit>.progress.json

Why the endpoint is in the key: a snapshot is only as trustworthy as the server that listed its
files. Two resources naming the same repository and commit at different endpoints (the public
hub and a mirror, or a hub that a tenant runs) get different folders, so no answer of one
endpoint can put a file into, or remove one from, what another endpoint's resources serve;
the libraries' own caches (Hugging Face's `trees/<commit>.json`) are inside that folder too.
The key is readable (the host) and exact (a hash of the normalised URL: scheme, host, port, path).

The lock is per repository because the blobs are: two revisions of one repository share blob
files (Hugging Face's `blobs/`), and a download's cleanup of partial files must not meet another
revision's download in flight.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from pathlib import Path
from typing import Final

# The libraries' own defaults (huggingface_hub constants.ENDPOINT, modelscope_hub's default
# endpoint): a resource without `endpoint` and one that names the public hub share one folder.
DEFAULT_ENDPOINTS: Final = {"huggingface": "https://huggingface.co", "modelscope": "https://www.modelscope.cn"}


def normalised_endpoint(hub: str, endpoint: str | None) -> str:
    url = urllib.parse.urlsplit(endpoint or DEFAULT_ENDPOINTS[hub])
    scheme, host = url.scheme.lower(), (url.hostname or "").lower()
    default_port = {"https": 443, "http": 80}.get(scheme)
    port = f":{url.port}" if url.port is not None and url.port != default_port else ""
    return f"{scheme}://{host}{port}{url.path.rstrip('/')}"


def endpoint_key(hub: str, endpoint: str | None) -> str:
    """A folder name for the endpoint: `<host>[-<port>]-<12 hex digits of its normalised URL>`."""
    url = normalised_endpoint(hub, endpoint)
    readable = re.sub(r"[^a-z0-9.-]", "-", urllib.parse.urlsplit(url).netloc.lower())[:64]
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def library_cache(cache: Path, hub: str, endpoint: str | None) -> Path:
    """The cache_dir handed to the hub library for this endpoint."""
    return cache / hub / endpoint_key(hub, endpoint)


def repository_name(repo: str) -> str:
    """owner/name -> owner--name (as both libraries name their folders)."""
    return repo.replace("/", "--")


def lock_dir(cache: Path, hub: str, endpoint: str | None) -> Path:
    return cache / ".npu" / "locks" / hub / endpoint_key(hub, endpoint)


def lock_file(cache: Path, hub: str, endpoint: str | None, repo: str) -> Path:
    return lock_dir(cache, hub, endpoint) / f"{repository_name(repo)}.lock"


def progress_file(cache: Path, hub: str, endpoint: str | None, repo: str, commit: str) -> Path:
    return lock_dir(cache, hub, endpoint) / f"{repository_name(repo)}@{commit}.progress.json"
