"""Where the demo finds the repository's files: the chart, the examples, the tools scripts/bootstrap fetches."""

from __future__ import annotations

from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[3]
CHART: Final = ROOT / "charts" / "npu-inference-operator"
EXAMPLES: Final = ROOT / "examples"
# helm and kubectl, where scripts/bootstrap puts them (else they are looked up on PATH).
TOOLS: Final = ROOT / ".cache" / "k8s-tools" / "bin"
KUBECTL: Final = TOOLS / "kubectl"
