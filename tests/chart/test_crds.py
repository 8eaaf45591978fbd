"""The chart's CRDs: an identical copy of the NPUInference CRD, kopf's peering CRDs, both kept.

Why a copy: Helm can only read files inside the chart (`.Files.Get`), and a chart is packaged
and pulled on its own, so a symlink out of the chart would not survive `helm package`. The copy
is checked byte for byte here; after editing crds/, run
`cp crds/inference.npu.dev_npuinferences.yaml charts/npu-inference-operator/files/crds/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kopf._cogs.structs import references

from tests.chart.helm import CHART, JSON, ROOT, by_kind, render

SOURCE = ROOT / "crds" / "inference.npu.dev_npuinferences.yaml"
COPY = CHART / "files" / "crds" / SOURCE.name
KEEP = {"helm.sh/resource-policy": "keep"}


def crds(objects: list[JSON]) -> dict[str, JSON]:
    return {crd["metadata"]["name"]: crd for crd in by_kind(objects, "CustomResourceDefinition")}


def with_annotations(obj: dict[str, Any], annotations: dict[str, str]) -> dict[str, Any]:
    meta = {**obj["metadata"], "annotations": {**obj["metadata"].get("annotations", {}), **annotations}}
    return {**obj, "metadata": meta}


def test_the_chart_ships_an_identical_copy_of_the_crd() -> None:
    assert COPY.read_bytes() == SOURCE.read_bytes(), (
        f"the chart's CRD differs: cp {SOURCE.relative_to(ROOT)} {COPY.parent.relative_to(ROOT)}/"
    )


def test_the_rendered_crd_is_the_file_plus_the_keep_annotation() -> None:
    source = yaml.safe_load(SOURCE.read_text(encoding="utf-8"))
    rendered = crds(render())[source["metadata"]["name"]]
    assert rendered == with_annotations(source, KEEP)


def test_without_keep_the_rendered_crd_is_the_file_itself(tmp_path: Path) -> None:
    source = yaml.safe_load(SOURCE.read_text(encoding="utf-8"))
    rendered = crds(render({"crds": {"keep": False}}, tmp_path))[source["metadata"]["name"]]
    assert rendered == source


def test_crds_are_gated_by_values(tmp_path: Path) -> None:
    assert sorted(crds(render())) == [
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
        "npuinferences.inference.npu.dev",
    ]
    assert sorted(crds(render({"crds": {"install": False}}, tmp_path))) == [
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ]
    assert sorted(crds(render({"peering": {"installCRDs": False}}, tmp_path))) == ["npuinferences.inference.npu.dev"]


def test_peering_crds_are_the_ones_kopf_uses_and_are_kept() -> None:
    found = crds(render())
    for selector, scope in (
        (references.CLUSTER_PEERINGS_K, "Cluster"),
        (references.NAMESPACED_PEERINGS_K, "Namespaced"),
    ):
        crd = found[f"{selector.any_name}.{selector.group}"]
        assert crd["spec"]["scope"] == scope
        assert [v["name"] for v in crd["spec"]["versions"]] == [selector.version]
        assert crd["metadata"]["annotations"] == KEEP
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True, "kopf writes its peers into .status"
