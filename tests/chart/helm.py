"""The real helm binary (fetched by scripts/fetch_k8s_tools.py) and what the chart renders.

`render()` runs `helm template` and returns the objects; `validate()` checks one object the way
an API server would: Kubernetes' own kinds against Kubernetes' schemas (kubernetes-validate,
strict), prometheus-operator's kinds against its CRD models, and custom resources the chart
defines (kopf's peering objects) against the openAPIV3Schema of the CRD the chart renders.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.chart import monitoring

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "npu-inference-operator"
TOOLS = ROOT / ".cache" / "k8s-tools" / "bin"
KUBERNETES_VERSION = "1.37.0"
RELEASE = "npu"
NAMESPACE = "npu-system"

JSON = dict[str, Any]


@functools.cache
def helm_binary() -> str:
    """`.cache/k8s-tools/bin/helm`, fetched on first use (as scripts/bootstrap does), else PATH."""
    if not (TOOLS / "helm").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_k8s_tools.py")], check=True, timeout=600)
    found = TOOLS / "helm" if (TOOLS / "helm").is_file() else shutil.which("helm")
    if not found:
        raise RuntimeError("helm not found: run scripts/bootstrap (it fetches helm into .cache/k8s-tools/bin)")
    return str(found)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def value_args(values: Mapping[str, Any] | None, tmp: Path | None) -> list[str]:
    if not values:
        return []
    if tmp is None:
        raise ValueError("values need a tmp folder to be written to")
    handle, name = tempfile.mkstemp(prefix="values-", suffix=".yaml", dir=tmp)
    os.close(handle)
    path = Path(name)
    path.write_text(yaml.safe_dump(dict(values)), encoding="utf-8")
    return ["--values", str(path)]


def template(values: Mapping[str, Any] | None = None, tmp: Path | None = None, *extra: str) -> str:
    return helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *value_args(values, tmp), *extra).stdout


def render(values: Mapping[str, Any] | None = None, tmp: Path | None = None, *extra: str) -> list[JSON]:
    return [doc for doc in yaml.safe_load_all(template(values, tmp, *extra)) if doc]


def by_kind(objects: Sequence[JSON], kind: str) -> list[JSON]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: Sequence[JSON], kind: str, name: str | None = None) -> JSON:
    found = [obj for obj in by_kind(objects, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def validate(obj: JSON, objects: Sequence[JSON]) -> str:
    """Raise when `obj` would be refused; return how it was validated."""
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    if group == monitoring.GROUP:
        monitoring.validate(obj)
        return "prometheus-operator models"
    crd = _crd_for(obj, objects)
    if crd is not None:
        version = next(v for v in crd["spec"]["versions"] if obj["apiVersion"].endswith("/" + v["name"]))
        schema = version["schema"]["openAPIV3Schema"]
        jsonschema.Draft4Validator(_strip_extensions(schema)).validate(obj)
        expect_namespace = crd["spec"]["scope"] == "Namespaced"
        assert ("namespace" in obj["metadata"]) == expect_namespace, f"{obj['kind']}: namespace vs CRD scope"
        return "rendered CRD schema"
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    return "kubernetes-validate"


def _crd_for(obj: JSON, objects: Sequence[JSON]) -> JSON | None:
    group = obj["apiVersion"].split("/")[0]
    for crd in by_kind(objects, "CustomResourceDefinition"):
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == obj["kind"]:
            return crd
    return None


def _strip_extensions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_extensions(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if isinstance(schema, list):
        return [_strip_extensions(v) for v in schema]
    return schema
