"""Reading files a user names: regular files only, checked before a byte is read.

A FIFO, a socket or a device named as a config file would block a read forever (a FIFO with no
writer) or never end (/dev/zero), with liveness still reporting OK. `open_regular` opens without
blocking, checks what the open descriptor is, and refuses anything but a regular file with an
error naming the path; `read_text` also refuses bytes that are not UTF-8 and files over a size.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, Final

MAX_TEXT_BYTES: Final = 64 * 2**20  # config files are KiB; a tokenizer.json a few MiB

_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class FileProblem(ValueError):
    """A file that cannot be read as asked; the message starts with its path."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for binary reading, if it is a regular file (symlinks followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise FileProblem(f"{os.fspath(path)}: file not found") from None
    except OSError as exc:
        raise FileProblem(f"{os.fspath(path)}: cannot open: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise FileProblem(f"{os.fspath(path)}: is {kind}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_text(path: str | os.PathLike[str], *, limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of the regular file `path`, at most `limit` bytes."""
    with open_regular(path) as handle:
        return read_bounded(handle, os.fspath(path), limit=limit)


def read_bounded(handle: BinaryIO, name: str, *, limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of an open binary stream (a file, standard input), at most `limit` bytes;
    `name` is what a refusal calls it."""
    try:
        data = handle.read(limit + 1)
    except OSError as exc:
        raise FileProblem(f"{name}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise FileProblem(f"{name}: larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(f"{name}: not UTF-8 text (byte {exc.start})") from None
