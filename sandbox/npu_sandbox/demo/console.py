"""The story on the terminal: what the sandbox says as it goes, and how it fails."""

from __future__ import annotations


class SandboxFailed(Exception):
    """The chain broke somewhere; the message says where, with the evidence."""


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(text: str) -> None:
    say(f"\n=== {text}")
