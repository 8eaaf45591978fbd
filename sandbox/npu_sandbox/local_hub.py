"""A model hub on 127.0.0.1: one model directory served in Hugging Face's and ModelScope's API shapes.

The hubs cannot be reached from the machines this project is tested on, so the real
`huggingface_hub` and `modelscope` clients are pointed at this server through their endpoint
settings (`HF_ENDPOINT` / `endpoint=`, `MODELSCOPE_ENDPOINT` / `endpoint=`). It serves what those
clients read: the revision (resolved to a commit), the file tree with sizes and hashes, and the
files themselves with HTTP Range (so a cut download can resume). Files named `*.safetensors` are
served as LFS objects (sha256), the rest as git blobs (sha1), as the Hugging Face Hub does.

Faults for tests, each set on `LocalHub.faults`: a token every request must carry (401 without
it), a connection cut after N bytes of a file (once), a file served with wrong bytes of the right
size. `LocalHub.served` counts the file bodies sent, so a test can prove a second replica
downloaded nothing.

And a hostile hub, for the fetch's trust boundary: a revision answered with a commit that is not
one (`commit`), listing entries that name paths outside the repository (`listed`), listed sizes
that differ from the bodies (`listed_sizes`), bodies that never end (`endless`). A branch moves
with `LocalHub.push` (older commits stay fetchable by id), and tags name commits (`tags`).

    python -m npu_sandbox.local_hub MODEL_DIR --repo org/name [--port N]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import http.server
import json
import re
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Final

LFS_SUFFIXES: Final = (".safetensors", ".bin", ".pt")
DEFAULT_BRANCH: Final = "main"
# Both hubs' default branch names lead to the one commit (Hugging Face: main, ModelScope: master).
BRANCHES: Final = ("main", "master")


@dataclasses.dataclass(frozen=True)
class RepoFile:
    path: str
    size: int
    sha1: str  # git blob id
    sha256: str
    data: bytes

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.sha1


@dataclasses.dataclass(frozen=True)
class Repo:
    repo_id: str
    commit: str
    files: dict[str, RepoFile]

    @classmethod
    def from_directory(cls, repo_id: str, directory: Path) -> Repo:
        files: dict[str, RepoFile] = {}
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            data = path.read_bytes()
            name = path.relative_to(directory).as_posix()
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            files[name] = RepoFile(name, len(data), blob, hashlib.sha256(data).hexdigest(), data)
        # A commit id that changes whenever any file does (a real hub's is a git commit).
        commit = hashlib.sha1("".join(f.path + f.sha1 for f in files.values()).encode()).hexdigest()
        return cls(repo_id, commit, files)


@dataclasses.dataclass
class Faults:
    token: str | None = None  # requests without `Authorization: Bearer <token>` get 401
    cut_after: dict[str, int] = dataclasses.field(default_factory=dict)  # path -> bytes, then close (once)
    corrupt: set[str] = dataclasses.field(default_factory=set)  # paths served with wrong bytes, right size
    commit: str | None = None  # what revision answers name as the commit (HF `sha`, ModelScope `CommitId`)
    listed: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # extra entries: {"path", "size"}
    listed_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # path -> the size listings say
    endless: set[str] = dataclasses.field(default_factory=set)  # paths whose body never ends (no length)


class LocalHub:
    """Serves repositories on 127.0.0.1 in a background thread; `url` is the endpoint to give clients."""

    def __init__(self, repos: list[Repo], port: int = 0) -> None:
        self.repos = {repo.repo_id: repo for repo in repos}  # each repository's branch head
        self.commits = {(repo.repo_id, repo.commit): repo for repo in repos}  # every commit ever pushed
        self.tags: dict[tuple[str, str], str] = {}  # (repo_id, tag) -> commit
        self.faults = Faults()
        self.rate: float | None = None  # bytes per second per file body (to watch progress); None: as fast as it goes
        self.served: collections.Counter[str] = collections.Counter()  # "repo_id/path" -> file bodies sent
        self.bytes_served = 0
        self.ranges: list[tuple[str, int]] = []  # (path, first byte) of every Range request for a file
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> LocalHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def push(self, repo: Repo) -> None:
        """Moves the repository's branches to `repo`'s commit; the older commits stay fetchable."""
        self.repos[repo.repo_id] = repo
        self.commits[(repo.repo_id, repo.commit)] = repo

    def tag(self, repo: Repo, name: str) -> None:
        self.commits[(repo.repo_id, repo.commit)] = repo
        self.tags[(repo.repo_id, name)] = repo.commit

    def count(self, repo_id: str, path: str, sent: int) -> None:
        with self._lock:
            self.served[f"{repo_id}/{path}"] += 1
            self.bytes_served += sent

    def take_cut(self, path: str) -> int | None:
        with self._lock:
            return self.faults.cut_after.pop(path, None)


# Hugging Face: /api/models/{repo}/revision/{rev}, /api/models/{repo}/tree/{rev}, /{repo}/resolve/{rev}/{path}
_HF_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_HF_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_HF_FILE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
# ModelScope: /api/v1/models/{repo}/revisions, /api/v1/models/{repo}/repo/files, /api/v1/models/{repo}/repo
_MS_MODEL = re.compile(r"^/api/v1/models/(?P<repo>[^/]+/[^/]+)(?P<rest>/.*)?$")


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read counters, not logs
        return

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # --- routing ------------------------------------------------------------------------------

    def _route(self, *, head: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        path, query = urllib.parse.unquote(url.path), dict(urllib.parse.parse_qsl(url.query))
        token = self.owner.faults.token
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            return self._error(401, "Unauthorized", "Invalid username or password.")
        if match := _HF_INFO.match(path):
            if (repo := self._repo(match["repo"], match["rev"])) is not None:
                self._json(
                    {
                        "id": repo.repo_id,
                        "modelId": repo.repo_id,
                        "sha": self.owner.faults.commit or repo.commit,
                        "private": False,
                        "siblings": [{"rfilename": name} for name in repo.files],
                    }
                )
        elif match := _HF_TREE.match(path):
            if (repo := self._repo(match["repo"], match["rev"])) is not None:
                extra = [{"type": "file", "oid": "0" * 40, **entry} for entry in self.owner.faults.listed]
                self._json([_hf_entry(self._listed(f)) for f in repo.files.values()] + extra)
        elif match := _HF_FILE.match(path):
            if (repo := self._repo(match["repo"], match["rev"])) is not None:
                self._file(repo, match["path"], head=head, hf=True)
        elif match := _MS_MODEL.match(path):
            self._modelscope(match["repo"], match["rest"] or "", query, head=head)
        else:
            self._error(404, "NotFound", f"no route for {path}")

    def _repo(self, repo_id: str, revision: str) -> Repo | None:
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        found = self._at(repo, revision)
        if found is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return found

    def _at(self, head: Repo, revision: str) -> Repo | None:
        if revision in BRANCHES:
            return head
        commit = self.owner.tags.get((head.repo_id, revision), revision)
        return self.owner.commits.get((head.repo_id, commit))

    def _listed(self, f: RepoFile) -> RepoFile:
        size = self.owner.faults.listed_sizes.get(f.path)
        return f if size is None else dataclasses.replace(f, size=size)

    def _modelscope(self, repo_id: str, rest: str, query: dict[str, str], *, head: bool) -> None:
        revision = query.get("Revision") or query.get("revision") or "master"
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            return self._ms_error(404, f"model {repo_id} not found")
        if rest in ("", "/"):
            return self._ms_ok({"Id": 1, "Name": repo_id.split("/")[1], "Path": repo_id.split("/")[0]})
        if rest == "/revisions":
            commit = self.owner.faults.commit or repo.commit
            branch = {"Revision": "master", "CommitId": commit, "CreatedAt": 1767225600}
            tags = [
                {"Revision": tag, "CommitId": commit, "CreatedAt": 1767225600}
                for (repo_id, tag), commit in self.owner.tags.items()
                if repo_id == repo.repo_id
            ]
            return self._ms_ok({"RevisionMap": {"Branches": [branch], "Tags": tags}})
        if (found := self._at(repo, revision)) is None:
            return self._ms_error(404, f"revision {revision} not found")
        repo = found
        if rest == "/repo/files":
            extra = [
                {
                    "Name": e["path"].rsplit("/", 1)[-1],
                    "Path": e["path"],
                    "Type": "blob",
                    "Size": e["size"],
                    "Sha256": "0" * 64,
                    "IsLFS": False,
                    "Revision": repo.commit,
                }
                for e in self.owner.faults.listed
            ]
            files = [_ms_entry(repo, self._listed(f)) for f in repo.files.values()] + extra
            return self._ms_ok({"Files": files, "TotalCount": len(files)})
        if rest == "/repo":
            return self._file(repo, query.get("FilePath", ""), head=head, hf=False)
        return self._ms_error(404, f"no route for {rest}")

    # --- answers ------------------------------------------------------------------------------

    def _file(self, repo: Repo, path: str, *, head: bool, hf: bool) -> None:
        entry = repo.files.get(path)
        if entry is None:
            return (
                self._error(404, "EntryNotFound", f"{path} not in {repo.repo_id}")
                if hf
                else self._ms_error(404, f"file {path} not found")
            )
        data = entry.data
        if path in self.owner.faults.corrupt:
            data = bytes(b ^ 0xFF for b in data)
        start, status = 0, 200
        if (ranged := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))) is not None:
            start, status = int(ranged[1]), 206
            if not head:
                self.owner.ranges.append((path, start))
        body = data[start:]
        if path in self.owner.faults.endless and not head:
            return self._endless(repo, path, body)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{entry.etag}"')
        self.send_header("X-Repo-Commit", repo.commit)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        cut = self.owner.take_cut(path)
        if cut is not None and cut < len(body):
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.owner.count(repo.repo_id, path, cut)
            self.close_connection = True
            self.connection.shutdown(2)  # the client sees a short read, as after a dropped connection
            return
        self._send(body)
        self.owner.count(repo.repo_id, path, len(body))

    def _endless(self, repo: Repo, path: str, body: bytes) -> None:
        """The file's bytes, then more, with no length: until the client hangs up (or 256 MiB)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        sent, chunk = 0, (body or b"x") * max(1, (1 << 20) // max(len(body), 1))
        try:
            self.wfile.write(body)
            sent = len(body)
            while sent < 256 << 20:
                self.wfile.write(chunk)
                sent += len(chunk)
        except OSError:
            pass
        self.owner.count(repo.repo_id, path, sent)

    def _send(self, body: bytes) -> None:
        rate = self.owner.rate
        if not rate:
            self.wfile.write(body)
            return
        step = 64 << 10
        for offset in range(0, len(body), step):
            self.wfile.write(body[offset : offset + step])
            time.sleep(min(len(body) - offset, step) / rate)

    def _json(self, payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._json({"error": message}, status, {"X-Error-Code": code, "X-Error-Message": message})

    def _ms_ok(self, data: Any) -> None:
        self._json({"Code": 200, "Success": True, "Message": "success", "Data": data, "RequestId": "local"})

    def _ms_error(self, status: int, message: str) -> None:
        self._json({"Code": status, "Success": False, "Message": message, "RequestId": "local"}, status)


def _hf_entry(f: RepoFile) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "file", "oid": f.sha1, "size": f.size, "path": f.path}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
    return entry


def _ms_entry(repo: Repo, f: RepoFile) -> dict[str, Any]:
    return {
        "Name": f.path.rsplit("/", 1)[-1],
        "Path": f.path,
        "Type": "blob",
        "Size": f.size,
        "Sha256": f.sha256,
        "IsLFS": f.lfs,
        "Revision": repo.commit,
        "CommittedDate": 1767225600,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npu_sandbox.local_hub", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--repo", required=True, help="repository id to serve the directory as, e.g. org/name")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    hub = LocalHub([Repo.from_directory(args.repo, args.model_dir)], args.port).start()
    print(f"serving {args.repo} at {hub.url}", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
