"""The CRD: a corpus of invalid manifests, each rejected by its schema or a CEL rule, and the examples accepted.

The rules are evaluated as the API server would: defaults first, then the openAPIV3Schema
(jsonschema, draft 4 keywords), list types, then every x-kubernetes-validations rule (cel-python,
with the Kubernetes list library functions the rules use).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_operator.api import crd

from tests.examples import EXAMPLES, example

ROOT = Path(__file__).resolve().parents[2]
Manifest = dict[str, Any]


def base() -> Manifest:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": "qwen", "namespace": "llm"},
        "spec": {
            "model": {
                "name": "Qwen/Qwen2.5-7B-Instruct",
                "path": "/models/qwen",
                "source": {"persistentVolumeClaim": {"claimName": "models"}},
            }
        },
    }


def hub_model(**source: Any) -> dict[str, Any]:
    """spec.model with a hub source (Hugging Face unless `source` says otherwise) and a cache."""
    return {
        "name": "Qwen/Qwen2.5-7B-Instruct",
        "source": source or {"huggingFace": {"repository": "Qwen/Qwen2.5-7B-Instruct"}},
        "cache": {"claimName": "model-cache"},
    }


def setting(path: str, value: Any) -> Callable[[Manifest], None]:
    def change(manifest: Manifest) -> None:
        *parents, last = path.split(".")
        node = manifest
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(last)
        else:
            node[last] = value

    return change


DELETE = object()


def lora_adapter(name: str) -> dict[str, Any]:
    return {"name": name, "source": {"persistentVolumeClaim": {"claimName": "adapters", "subPath": name}}}


def settings(*changes: Callable[[Manifest], None]) -> Callable[[Manifest], None]:
    def change(manifest: Manifest) -> None:
        for one in changes:
            one(manifest)

    return change


# (id, change, a fragment of the message the user sees)
INVALID: list[tuple[str, Callable[[Manifest], None], str]] = [
    ("name-not-dns-1035", setting("metadata.name", "7b-model"), "DNS-1035"),
    ("name-too-long", setting("metadata.name", "a" * 64), "DNS-1035"),
    ("no-spec", setting("spec", DELETE), "'spec' is a required property"),
    ("no-model", setting("spec.model", DELETE), "'model' is a required property"),
    ("no-model-name", setting("spec.model.name", DELETE), "'name' is a required property"),
    ("empty-model-name", setting("spec.model.name", ""), "should be non-empty"),
    ("relative-model-path", setting("spec.model.path", "models/qwen"), "does not match"),
    ("model-path-outside-mount", setting("spec.model.path", "/data/qwen"), "must lie under model.mountPath"),
    ("no-model-source", setting("spec.model.source", {}), "exactly one of persistentVolumeClaim, hostPath"),
    (
        "two-model-sources",
        setting("spec.model.source.hostPath", {"path": "/data"}),
        "exactly one of persistentVolumeClaim, hostPath",
    ),
    (
        "volume-and-hub-sources",
        lambda m: m["spec"]["model"].update(
            source={"hostPath": {"path": "/data"}, "huggingFace": {"repository": "a/b"}}, cache={"claimName": "c"}
        ),
        "exactly one of persistentVolumeClaim, hostPath, huggingFace or modelScope",
    ),
    (
        "two-hub-sources",
        lambda m: m["spec"].update(
            model=hub_model(huggingFace={"repository": "a/b"}, modelScope={"repository": "a/b"})
        ),
        "exactly one of persistentVolumeClaim, hostPath, huggingFace or modelScope",
    ),
    (
        "hub-source-with-path",
        lambda m: m["spec"].update(model={**hub_model(), "path": "/models/qwen"}),
        "not allowed with a huggingFace or modelScope source",
    ),
    ("volume-source-without-path", setting("spec.model.path", DELETE), "model.path is required"),
    (
        "hub-source-without-cache",
        lambda m: m["spec"].update(model={k: v for k, v in hub_model().items() if k != "cache"}),
        "model.cache is required with a huggingFace or modelScope source",
    ),
    ("cache-with-volume-source", setting("spec.model.cache", {"claimName": "c"}), "and only with one"),
    (
        "repository-without-owner",
        lambda m: m["spec"].update(model=hub_model(huggingFace={"repository": "qwen"})),
        "does not match",
    ),
    (
        "endpoint-not-http",
        lambda m: m["spec"].update(model=hub_model(modelScope={"repository": "a/b", "endpoint": "ftp://mirror"})),
        "does not match",
    ),
    (
        "token-secret-without-name",
        lambda m: m["spec"].update(model=hub_model(huggingFace={"repository": "a/b", "tokenSecretRef": {}})),
        "'name' is a required",
    ),
    (
        "cache-size-not-a-quantity",
        lambda m: m["spec"].update(model={**hub_model(), "cache": {"claimName": "c", "create": {"size": "big"}}}),
        "does not match",
    ),
    ("pvc-without-claim", setting("spec.model.source.persistentVolumeClaim", {}), "'claimName' is a required"),
    ("pvc-absolute-subpath", setting("spec.model.source.persistentVolumeClaim.subPath", "/x"), "subPath must be"),
    ("pvc-escaping-subpath", setting("spec.model.source.persistentVolumeClaim.subPath", "a/../.."), "subPath must be"),
    ("relative-host-path", setting("spec.model.source", {"hostPath": {"path": "data"}}), "does not match"),
    ("negative-replicas", setting("spec.replicas", -1), "less than the minimum of 0"),
    ("replicas-as-string", setting("spec.replicas", "2"), "is not of type 'integer'"),
    ("npu-resource-without-domain", setting("spec.npu.resourceName", "Ascend910"), "does not match"),
    ("too-many-npus", setting("spec.npu.count", 17), "greater than the maximum of 16"),
    ("chip-without-npus", lambda m: m["spec"].update(npu={"count": 0, "chipName": "910B3"}), "needs npu.count"),
    (
        "chip-in-two-places",
        lambda m: m["spec"].update(
            npu={"count": 1, "chipName": "910B3"},
            template={"nodeSelector": {"node.kubernetes.io/npu.chip.name": "910B4"}},
        ),
        "not both",
    ),
    ("parallelism-product", setting("spec.parallelism", {"tensor": 2}), "must equal npu.count (1)"),
    (
        "parallelism-product-three-way",
        lambda m: m["spec"].update(npu={"count": 8}, parallelism={"tensor": 2, "pipeline": 2, "data": 1}),
        "parallelism.tensor x pipeline x data (4) must equal npu.count (8)",
    ),
    ("zero-tensor-parallel", setting("spec.parallelism", {"tensor": 0}), "less than the minimum of 1"),
    ("unknown-graph-mode", setting("spec.graph", {"mode": "FULL_DECODE"}), "is not one of"),
    ("capture-sizes-not-increasing", setting("spec.graph", {"captureSizes": [1, 4, 2]}), "strictly increasing"),
    ("capture-sizes-duplicate", setting("spec.graph", {"captureSizes": [1, 2, 2, 4]}), "duplicate value 2"),
    ("capture-size-zero", setting("spec.graph", {"captureSizes": [0, 1, 2]}), "less than the minimum of 1"),
    ("capture-sizes-empty", setting("spec.graph", {"captureSizes": []}), "should be non-empty"),
    (
        "capture-size-above-max-num-seqs",
        lambda m: m["spec"].update(graph={"captureSizes": [1, 2, 4, 8, 16]}, engine={"maxNumSeqs": 12}),
        "may not exceed engine.maxNumSeqs x (1 + speculative tokens) = 12",
    ),
    (
        "capture-size-above-speculative-ceiling",
        lambda m: m["spec"].update(
            graph={"captureSizes": [1, 8, 40]},
            engine={"maxNumSeqs": 16, "speculative": {"method": "mtp", "numTokens": 1}},
        ),
        "= 32",
    ),
    (
        "capture-size-above-max-capture-size",
        setting("spec.graph", {"captureSizes": [1, 2, 64], "maxCaptureSize": 32}),
        "may not exceed graph.maxCaptureSize (32)",
    ),
    ("capture-sizes-with-mode-none", setting("spec.graph", {"mode": "NONE", "captureSizes": [1]}), "other than NONE"),
    ("stream-budget-zero", setting("spec.graph", {"streamBudget": 0}), "less than the minimum of 1"),
    ("unknown-on-downgrade", setting("spec.graph", {"onDowngrade": "Ignore"}), "is not one of"),
    ("max-num-seqs-zero", setting("spec.engine", {"maxNumSeqs": 0}), "less than the minimum of 1"),
    (
        "memory-utilization-zero",
        setting("spec.engine", {"gpuMemoryUtilization": 0}),
        "less than or equal to the minimum",
    ),
    ("memory-utilization-above-one", setting("spec.engine", {"gpuMemoryUtilization": 1.2}), "greater than the maximum"),
    ("unknown-dtype", setting("spec.engine", {"dtype": "fp8"}), "is not one of"),
    (
        "draft-model-without-model",
        setting("spec.engine", {"speculative": {"method": "draft_model", "numTokens": 2}}),
        "draft_model needs speculative.model",
    ),
    (
        "speculative-without-tokens",
        setting("spec.engine", {"speculative": {"method": "mtp"}}),
        "'numTokens' is a required",
    ),
    (
        "env-value-and-value-from",
        setting("spec.engine", {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]}),
        "value or valueFrom, not both",
    ),
    (
        "env-duplicate-name",
        setting("spec.engine", {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
        "duplicate entry",
    ),
    ("bad-env-name", setting("spec.engine", {"env": [{"name": "1=A"}]}), "does not match"),
    ("startup-timeout-too-short", setting("spec.engine", {"startupTimeoutSeconds": 10}), "less than the minimum"),
    ("bad-shm-size", setting("spec.engine", {"shmSize": "lots"}), "does not match"),
    ("bad-cpu-quantity", setting("spec.resources", {"requests": {"cpu": "eight"}}), "does not match"),
    ("bad-toleration-operator", setting("spec.template", {"tolerations": [{"operator": "In"}]}), "is not one of"),
    ("bad-scrape-interval", setting("spec.metrics", {"podMonitor": {"interval": "30"}}), "does not match"),
    # A millisecond or one-second scrape of every engine pod loads Prometheus and the pods for nothing.
    ("scrape-interval-1ms", setting("spec.metrics", {"podMonitor": {"interval": "1ms"}}), "does not match"),
    ("scrape-interval-4s", setting("spec.metrics", {"podMonitor": {"interval": "4s"}}), "does not match"),
    ("autoscaling-without-max", setting("spec.autoscaling", {"minReplicas": 1}), "'maxReplicas' is a required"),
    (
        "autoscaling-min-above-max",
        setting("spec.autoscaling", {"minReplicas": 5, "maxReplicas": 2}),
        "autoscaling.minReplicas (5) may not exceed autoscaling.maxReplicas (2)",
    ),
    (
        "scale-to-zero-without-routing",
        setting("spec.autoscaling", {"minReplicas": 0, "maxReplicas": 2}),
        "(scale to zero) needs spec.routing",
    ),
    (
        "utilization-above-100",
        setting("spec.autoscaling", {"maxReplicas": 2, "targetUtilization": 101}),
        "greater than the maximum",
    ),
    (
        "scale-up-period-above-hpa-limit",
        setting("spec.autoscaling", {"maxReplicas": 2, "scaleUpPeriodSeconds": 3600}),
        "greater than the maximum",
    ),
    (
        "prometheus-not-a-url",
        setting("spec.autoscaling", {"maxReplicas": 2, "prometheus": {"address": "prometheus:9090"}}),
        "does not match",
    ),
    (
        "pd-scale-to-zero",
        settings(
            setting("spec.disaggregation", {"prefill": {}}),
            setting("spec.routing", {}),
            setting("spec.autoscaling", {"minReplicas": 0, "maxReplicas": 2}),
        ),
        "is not offered with spec.disaggregation",
    ),
    (
        "pd-prefill-min-above-max",
        setting("spec.disaggregation", {"prefill": {"minReplicas": 3, "maxReplicas": 2}}),
        "prefill.minReplicas (3) may not exceed prefill.maxReplicas (2)",
    ),
    ("pd-prefill-min-zero", setting("spec.disaggregation", {"prefill": {"minReplicas": 0}}), "less than the minimum"),
    ("routing-unknown-failure-mode", setting("spec.routing", {"failureMode": "Maybe"}), "is not one of"),
    ("gateway-without-name", setting("spec.routing", {"gateway": {"namespace": "gw"}}), "'name' is a required"),
    # Everything a user writes is data: revisions are names (no `$(VAR)`, no `..`), free-form fields bounded.
    *(
        (
            f"{hub}-revision-{label}",
            setting("spec.model", hub_model(**{hub: {"repository": "org/name", "revision": revision}})),
            "does not match",
        )
        for hub in ("huggingFace", "modelScope")
        for label, revision in (
            ("variable", "$(NPU_MODEL_TOKEN)"),
            ("climbing", "../../../../x/outside"),
            ("inner-dots", "main/../x"),
            ("absolute", "/abs"),
            ("space", "main branch"),
        )
    ),
    (
        "additional-config-too-many-keys",
        setting("spec.engine", {"additionalConfig": {f"k{i}": i for i in range(65)}}),
        "has too many properties",
    ),
    ("env-value-too-long", setting("spec.engine", {"env": [{"name": "A", "value": "x" * 32769}]}), "is too long"),
    (
        "env-value-from-two-sources",
        setting("spec.engine", {"env": [{"name": "A", "valueFrom": {"fieldRef": {}, "secretKeyRef": {}}}]}),
        "has too many properties",
    ),
    (
        "too-many-annotations",
        setting("spec.template", {"metadata": {"annotations": {f"a{i}": "x" for i in range(65)}}}),
        "has too many properties",
    ),
    ("affinity-not-an-affinity", setting("spec.template", {"affinity": {f"k{i}": {} for i in range(4)}}), "too many"),
    ("lora-rank-vllm-refuses", setting("spec.lora", {"maxLoraRank": 48}), "is not one of"),
    (
        "lora-cpu-below-gpu-slots",
        setting("spec.lora", {"maxLoras": 4, "maxCpuLoras": 2}),
        "must be at least lora.maxLoras",
    ),
    (
        "lora-more-adapters-than-kept",
        setting("spec.lora", {"maxLoras": 1, "adapters": [lora_adapter("a"), lora_adapter("b")]}),
        "the engine keeps at most 1",
    ),
    (
        "lora-adapter-named-as-the-base",
        lambda m: m["spec"].update(lora={"adapters": [lora_adapter(m["spec"]["model"]["name"])]}),
        "is the base model's",
    ),
    (
        "lora-adapter-listed-twice",
        setting("spec.lora", {"maxLoras": 2, "adapters": [lora_adapter("a"), lora_adapter("a")]}),
        "duplicate",
    ),
    (
        "lora-adapter-two-sources",
        setting(
            "spec.lora",
            {
                "adapters": [
                    {"name": "a", "source": {**lora_adapter("a")["source"], "huggingFace": {"repository": "o/a"}}}
                ]
            },
        ),
        "exactly one of persistentVolumeClaim, hostPath",
    ),
    (
        "lora-adapter-subpath-escapes",
        setting("spec.lora", {"adapters": [{"name": "a", "source": {"hostPath": {"path": "/x", "subPath": "../y"}}}]}),
        "must not contain '..'",
    ),
]


def test_the_revision_pattern_is_the_runtimes() -> None:
    """The runtime checks its --revision with the same pattern the CRD has (one source: the runtime's)."""
    from npu_runtime.fetch.listing import REVISION_PATTERN

    schema = crd.openapi_schema()
    source = schema["properties"]["spec"]["properties"]["model"]["properties"]["source"]["properties"]
    for hub in ("huggingFace", "modelScope"):
        assert source[hub]["properties"]["revision"]["pattern"] == REVISION_PATTERN


@pytest.mark.parametrize(("change", "fragment"), [(c, f) for _, c, f in INVALID], ids=[i for i, _, _ in INVALID])
def test_invalid_manifest_is_rejected_with_a_message_the_user_understands(
    change: Callable[[Manifest], None], fragment: str
) -> None:
    manifest = base()
    change(manifest)
    errors = crd.validate(manifest)
    assert errors, "accepted, but it must be rejected"
    assert any(fragment in error for error in errors), errors


def test_the_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 25


def test_the_base_manifest_is_valid() -> None:
    assert crd.validate(base()) == []


def test_lora_adapters_of_every_source_are_valid() -> None:
    manifest = base()
    hub = {"name": "chat", "source": {"modelScope": {"repository": "org/chat-lora", "revision": "v1"}}}
    host = {"name": "sql-v2", "source": {"hostPath": {"path": "/data/adapters", "subPath": "sql/v2"}}}
    manifest["spec"]["lora"] = {"maxLoras": 2, "maxCpuLoras": 3, "adapters": [lora_adapter("a"), hub, host]}
    assert crd.validate(manifest) == []


def test_scale_to_zero_with_routing_is_valid() -> None:
    manifest = base()
    manifest["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2}
    manifest["spec"]["routing"] = {}
    assert crd.validate(manifest) == []


@pytest.mark.parametrize(
    "model",
    [
        hub_model(),
        hub_model(modelScope={"repository": "Qwen/Qwen2.5-7B-Instruct", "revision": "v1.0"}),
        hub_model(huggingFace={"repository": "org/name", "revision": "refs/pr/1"}),
        hub_model(huggingFace={"repository": "org/name", "revision": "release/v2.1_rc-3"}),
        {
            **hub_model(
                huggingFace={
                    "repository": "deepseek-ai/DeepSeek-R1",
                    "revision": "a" * 40,
                    "allowPatterns": ["*.json", "*.safetensors", "tokenizer*"],
                    "ignorePatterns": ["original/*"],
                    "tokenSecretRef": {"name": "hf-token", "key": "HF_TOKEN"},
                    "endpoint": "https://hf-mirror.com",
                    "sendTokenOverHTTP": False,
                }
            ),
            "cache": {"claimName": "models", "create": {"size": "2Ti", "storageClassName": "nfs"}},
        },
    ],
    ids=["huggingFace", "modelScope", "pull-request-ref", "branch-with-slash", "everything"],
)
def test_hub_sources_are_valid(model: dict[str, Any]) -> None:
    manifest = base()
    manifest["spec"]["model"] = model
    defaulted = crd.apply_defaults(manifest)
    assert crd.validate(defaulted) == []
    if "create" in model["cache"]:
        assert defaulted["spec"]["model"]["cache"]["create"]["accessMode"] == "ReadWriteMany"


@pytest.mark.parametrize("name", sorted(path.name for path in EXAMPLES.glob("*.yaml")))
def test_examples_are_valid(name: str) -> None:
    assert crd.validate(example(name)) == []


def test_cel_is_evaluated_here() -> None:
    assert crd.cel_available(), "cel-python must be installed for the CEL half of this corpus"


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for key, sub in schema.get("properties", {}).items():
        found += walk(sub, f"{path}.{key}" if path else key)
    if "items" in schema:
        found += walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += walk(schema["additionalProperties"], f"{path}{{}}")
    return found


def test_every_field_has_a_description_for_kubectl_explain() -> None:
    missing = [
        path
        for path, schema in walk(crd.openapi_schema())
        if path and not path.endswith(("[]", "{}")) and path != "metadata" and not schema.get("description")
    ]
    assert missing == []


def test_every_default_is_valid_against_its_own_schema() -> None:
    defaulted = crd.apply_defaults(base())
    assert crd.validate(defaulted) == []
    assert defaulted["spec"]["graph"]["mode"] == "FULL_DECODE_ONLY"
    assert defaulted["spec"]["npu"]["count"] == 1


def test_the_package_ships_the_crd_of_crds_folder() -> None:
    on_disk = yaml.safe_load((ROOT / "crds" / "inference.npu.dev_npuinferences.yaml").read_text(encoding="utf-8"))
    assert crd.load_crd() == on_disk


def test_names_and_subresources() -> None:
    loaded = crd.load_crd()
    names = loaded["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "NPUInference",
        "npuinferences",
        ["npuinf"],
        ["all"],
    )
    version = crd.version_spec()
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == ["Model", "Mode", "Ready", "Phase", "Reason", "Download", "Adapters", "Age"]


def test_defaults_do_not_touch_what_the_user_wrote() -> None:
    manifest = base()
    manifest["spec"]["engine"] = {"maxNumSeqs": 12}
    original = copy.deepcopy(manifest)
    defaulted = crd.apply_defaults(manifest)
    assert manifest == original
    assert defaulted["spec"]["engine"]["maxNumSeqs"] == 12


def test_the_api_reference_is_generated_from_this_crd() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_api_docs", ROOT / "scripts" / "gen_api_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert committed == module.render(), "docs/api.md is stale: run .venv/bin/python scripts/gen_api_docs.py"
