"""What a fetch expects of the bodies a hub sends: each Hugging Face file by its URL, none past its listed size."""

from __future__ import annotations

import dataclasses
import threading
from typing import Final

from npu_runtime.fetch.listing import Listing, RemoteFile
from npu_runtime.fetch.verify import Verification


class BodyTooLong(Exception):
    """A file's body went past its listed size (a hostile or broken endpoint)."""


@dataclasses.dataclass(frozen=True)
class ExpectedBody:
    repo: str
    remote: RemoteFile
    verification: Verification


class ExpectedBodies:
    """What this process's fetches expect from Hugging Face endpoints: each listed file by the URL path
    suffix `/<repo>/resolve/<commit>/<path>` (and by the URL a hub redirected it to), with the
    fetch's Verification; and the commit each revision answer must name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bodies: dict[str, ExpectedBody] = {}
        self.aliases: dict[str, ExpectedBody] = {}  # full URL -> body: where a hub's answer for a file points
        self.commits: dict[str, str] = {}  # "/api/models/<repo>/revision/<commit>" -> commit

    def expect(self, repo: str, listing: Listing, verification: Verification) -> None:
        with self._lock:
            for remote in listing.files:
                self.bodies[f"/{repo}/resolve/{listing.commit}/{remote.path}"] = ExpectedBody(
                    repo, remote, verification
                )
            self.commits[f"/api/models/{repo}/revision/{listing.commit}"] = listing.commit

    def forget(self, verification: Verification) -> None:
        with self._lock:
            for table in (self.bodies, self.aliases):
                for key in [key for key, body in table.items() if body.verification is verification]:
                    del table[key]

    def body(self, url: str, path: str) -> ExpectedBody | None:
        """The listed file a request is for: by its URL path's suffix (exactly one), else by an alias."""
        with self._lock:
            found = {
                id(body): body
                for at in range(len(path))
                if path[at] == "/" and (body := self.bodies.get(path[at:])) is not None
            }
            if len(found) == 1:
                return next(iter(found.values()))
            return self.aliases.get(url) if not found else None

    def alias(self, url: str, body: ExpectedBody) -> None:
        with self._lock:
            self.aliases[url] = body

    def commit(self, path: str) -> str | None:
        with self._lock:
            return next((commit for suffix, commit in self.commits.items() if path.endswith(suffix)), None)


EXPECTED_BODIES: Final = ExpectedBodies()
