"""spec.lora in the children: the adapter list's ConfigMap, the pod's volumes, and a list change that
leaves the pod template (and so the pods) as they are."""

from __future__ import annotations

import copy
import json
from typing import Any

from npu_operator.api.config import OperatorConfig
from npu_operator.api.spec import LORA_DIR, parse_spec
from npu_operator.children import engine_pod, lora
from npu_operator.topologies import build_children
from npu_runtime.adapters import ADAPTER_LIST_FILE, parse_adapter_list
from npu_runtime.contract import parse_serve_args

from tests.examples import example

CONFIG = OperatorConfig()


def spec_of(manifest: dict[str, Any]) -> Any:
    return parse_spec(manifest["spec"])


def template(manifest: dict[str, Any]) -> dict[str, Any]:
    return engine_pod.pod_template(manifest["metadata"]["name"], spec_of(manifest), CONFIG)


def with_adapter(manifest: dict[str, Any], adapter: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(manifest)
    changed["spec"]["lora"]["adapters"].append(adapter)
    return changed


def test_the_list_names_each_adapter_where_the_pod_sees_it() -> None:
    manifest = example("qwen2.5-7b-lora.yaml")
    config_map = build_children("qwen25-7b-lora", "llm", spec_of(manifest), CONFIG)[-1]
    assert (config_map["kind"], config_map["metadata"]["name"]) == ("ConfigMap", "qwen25-7b-lora-lora")
    listed = parse_adapter_list(json.loads(config_map["data"][ADAPTER_LIST_FILE]))
    assert listed.base_model == "Qwen/Qwen2.5-7B-Instruct" and listed.cache == lora.CACHE_DIR
    sql, chat, summarize = listed.adapters
    volume = template(manifest)["spec"]["volumes"]
    claim = next(v for v in volume if (v.get("persistentVolumeClaim") or {}).get("claimName") == "adapter-store")
    assert sql.path == f"{LORA_DIR}/{claim['name']}/qwen2.5-7b/sql"
    assert chat.path == f"{LORA_DIR}/{claim['name']}/qwen2.5-7b/support-chat"
    assert (summarize.hub, summarize.repository, summarize.revision) == (
        "huggingface",
        "example-org/qwen2.5-7b-summarize-lora",
        "main",
    )


def test_the_engine_is_started_with_the_limits_and_the_list() -> None:
    pod = template(example("qwen2.5-7b-lora.yaml"))["spec"]
    options = parse_serve_args(pod["containers"][0]["args"][2:])
    assert options.lora_adapters == lora.LIST_FILE
    assert (options.plan.max_loras, options.plan.max_lora_rank, options.plan.max_cpu_loras) == (8, 64, 16)
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[lora.LIST_FILE.rsplit("/", 1)[0]]["readOnly"] is True and "subPath" not in mounts[lora.CACHE_DIR]
    assert "readOnly" not in mounts[lora.CACHE_DIR]  # serve downloads the hub adapters added later


def test_an_adapter_in_a_mounted_claim_or_from_a_hub_changes_the_config_map_not_the_template() -> None:
    manifest = example("qwen2.5-7b-lora.yaml")
    in_claim = {"name": "legal", "source": {"persistentVolumeClaim": {"claimName": "adapter-store", "subPath": "l"}}}
    from_hub = {"name": "math", "source": {"modelScope": {"repository": "org/math-lora"}}}
    for added in (in_claim, from_hub):
        changed = with_adapter(manifest, added)
        assert template(changed) == template(manifest)
        before = build_children("x", "llm", spec_of(manifest), CONFIG)[-1]
        after = build_children("x", "llm", spec_of(changed), CONFIG)[-1]
        assert before["data"] != after["data"]


def test_an_adapter_in_a_new_claim_adds_a_volume_and_a_new_limit_rolls_the_pods() -> None:
    manifest = example("qwen2.5-7b-lora.yaml")
    elsewhere = {"name": "legal", "source": {"persistentVolumeClaim": {"claimName": "other", "subPath": "l"}}}
    names = {v["name"] for v in template(with_adapter(manifest, elsewhere))["spec"]["volumes"]}
    assert names - {v["name"] for v in template(manifest)["spec"]["volumes"]} == {
        lora.volume_of(spec_of(with_adapter(manifest, elsewhere)).lora.adapters[-1])
    }
    higher = copy.deepcopy(manifest)
    higher["spec"]["lora"]["maxLoraRank"] = 128
    assert template(higher) != template(manifest)


def test_hub_adapters_download_into_the_model_cache_when_the_spec_has_one() -> None:
    manifest = example("qwen2.5-7b-modelscope.yaml")
    manifest["spec"]["lora"] = {"adapters": [{"name": "a", "source": {"huggingFace": {"repository": "o/a"}}}]}
    pod = template(manifest)["spec"]
    cache_claim = manifest["spec"]["model"]["cache"]["claimName"]
    for container in (pod["initContainers"][0], pod["containers"][0]):
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == lora.CACHE_DIR)
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["persistentVolumeClaim"]["claimName"] == cache_claim
    init_args = pod["initContainers"][0]["args"]
    assert init_args[init_args.index("--adapters") + 1] == lora.LIST_FILE


def test_without_a_model_cache_each_pod_downloads_into_its_own_volume() -> None:
    pod = template(example("qwen2.5-7b-lora.yaml"))["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == lora.CACHE_DIR)
    assert next(v for v in pod["volumes"] if v["name"] == mount["name"]) == {"name": lora.CACHE_VOLUME, "emptyDir": {}}


def test_no_lora_no_list_and_no_flags() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    assert all(child["kind"] != "ConfigMap" for child in build_children("x", "llm", spec_of(manifest), CONFIG))
    args = template(manifest)["spec"]["containers"][0]["args"]
    assert not any("lora" in arg for arg in args)
