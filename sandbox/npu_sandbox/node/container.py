"""A container's spec as this machine reads it: its command line, its env, Kubernetes' `$(VAR)`
expansion, and the paths under its volume mounts mapped to where the volumes lie here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final


class NotYet(Exception):
    """The container cannot start in this round (e.g. its leader is not running yet); try the next."""


def container_args(container: Mapping[str, Any]) -> list[str]:
    """The container's command, then its args, as written."""
    return [*container.get("command", []), *container.get("args", [])]


_VARIABLE: Final = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command, args and env values: `$$` is a literal `$`, an
    unknown name stays as written (k8s.io/kubernetes third_party/forked/golang/expansion)."""

    def one(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _VARIABLE.sub(one, text)


def container_env(container: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, str]:
    """The container's env as written: values (with `$(VAR)` expansion) and the downward API's
    `fields` (fieldPath -> value) where a variable refers to one."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
        elif (path := var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")) in fields:
            env[var["name"]] = fields[path]
    return env


def mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[tuple[str, Path]]:
    """(mountPath, directory on this machine) of a container, longest mount path first."""
    found = [(m["mountPath"], volumes[m["name"]]) for m in container.get("volumeMounts", []) if m["name"] in volumes]
    return sorted(found, key=lambda item: -len(item[0]))


def map_paths(args: list[str], mounted: list[tuple[str, Path]]) -> list[str]:
    """The args with every path under a mount rewritten to where that volume lies on this machine."""
    result = []
    for arg in args:
        for mount_path, local in mounted:
            if arg == mount_path or arg.startswith(mount_path.rstrip("/") + "/"):
                arg = str(local) + arg[len(mount_path.rstrip("/")) :]
                break
        result.append(arg)
    return result
