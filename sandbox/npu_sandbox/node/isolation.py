"""A pod's own view of the node's name files: its processes in a mount and UTS namespace of their own.

Each pod's processes start (`PodNamespace.enter`, in the child between fork and exec) in a new
mount namespace, with every mount private to it, and a new UTS namespace (Linux unshare(2) with
CLONE_NEWNS | CLONE_NEWUTS), where

- the pod's hosts file is bind-mounted over /etc/hosts, its resolv.conf over /etc/resolv.conf and
  its nsswitch.conf over /etc/nsswitch.conf (`npu_sandbox.node.dns` writes them); a bind mount
  shows the file itself, so the kubelet's later rewrites in place are what the pod reads next;
- the hostname is the pod's (sethostname(2)), as a kubelet sets it.

Nothing else is isolated: the network, the processes, the rest of the file system are this
machine's. It takes root (CAP_SYS_ADMIN); `check` says at once, naming what is missing, when this
machine cannot do it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWUTS: Final = 0x04000000
MS_BIND: Final = 4096
MS_REC: Final = 16384
MS_PRIVATE: Final = 1 << 18
# What a pod's files replace: the node's file -> the pod's file name in its directory.
REPLACED: Final = {"/etc/hosts": "hosts", "/etc/resolv.conf": "resolv.conf", "/etc/nsswitch.conf": "nsswitch.conf"}
WHAT: Final = (
    "the sandbox's kubelet runs each pod in a mount and UTS namespace of its own (Linux unshare(2) with "
    "CLONE_NEWNS|CLONE_NEWUTS, bind mounts over /etc/hosts, /etc/resolv.conf and /etc/nsswitch.conf, "
    "sethostname(2)), which needs root (CAP_SYS_ADMIN) on Linux"
)


class IsolationUnavailable(Exception):
    """This machine cannot give a pod its own /etc/hosts; the message names what is missing."""


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return libc


def _call(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


@dataclasses.dataclass(frozen=True)
class PodNamespace:
    """What a pod's processes see in place of the node's: its files (in `directory`) and its hostname."""

    directory: Path
    hostname: str

    def files(self) -> dict[str, Path]:
        """Node path -> the pod's file, for the node paths that exist (resolv.conf and nsswitch.conf may not)."""
        return {
            target: self.directory / name
            for target, name in REPLACED.items()
            if target == "/etc/hosts" or os.path.exists(target)
        }

    def prepare(self) -> None:
        """Load libc in the parent: the child, between fork and exec, only makes system calls."""
        _libc()

    def enter(self) -> None:
        """In the child before exec: the new namespaces, the bind mounts, the hostname. Raises OSError."""
        libc = _libc()
        _call(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare(CLONE_NEWNS|CLONE_NEWUTS)")
        # Nothing mounted here may reach the node's namespace (systemd makes / shared).
        _call(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        for target, source in self.files().items():
            _call(libc.mount(bytes(source), target.encode(), None, MS_BIND, None), f"mount --bind {source} {target}")
        name = self.hostname.encode()
        _call(libc.sethostname(name, len(name)), f"sethostname({self.hostname})")


_PROBE: Final = """
import sys
from pathlib import Path
from npu_sandbox.node.isolation import PodNamespace
namespace = PodNamespace(Path(sys.argv[1]), "npu-sandbox-probe")
try:
    namespace.enter()
except OSError as exc:
    print(exc.strerror)
    sys.exit(1)
if Path("/etc/hosts").read_text() != "probe\\n":
    print("the bind-mounted /etc/hosts does not show the pod's file")
    sys.exit(1)
"""


@functools.cache
def check() -> None:
    """Raise IsolationUnavailable, naming what is missing, unless a pod can get its own namespaces here
    (tried once per process, in a child process: the kubelet's own namespaces stay as they are)."""
    if not sys.platform.startswith("linux"):
        raise IsolationUnavailable(f"{WHAT}; this is {sys.platform}")
    if not os.path.exists("/etc/hosts"):
        raise IsolationUnavailable(f"{WHAT}; this machine has no /etc/hosts to mount the pod's over")
    with tempfile.TemporaryDirectory(prefix="npu-sandbox-probe-") as directory:
        for name in REPLACED.values():
            (Path(directory) / name).write_text("probe\n", encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}  # finds this module
        result = subprocess.run(
            [sys.executable, "-c", _PROBE, directory], capture_output=True, text=True, timeout=30, check=False, env=env
        )
    if result.returncode != 0:
        detail = (result.stdout.strip() or result.stderr.strip() or "no output").splitlines()[-1]
        user = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}, not root"
        raise IsolationUnavailable(f"{WHAT}; here ({user}) it failed: {detail}")
