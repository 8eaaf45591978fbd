from npu_operator import crd
from npu_sandbox.cluster import LocalCluster

from tests.operator.conftest import example


async def test_smoke(operator: LocalCluster) -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    manifest["metadata"]["namespace"] = "default"
    await operator.apply_npu_inference(manifest)

    async def deployment():
        return await operator.get("apps/v1", "deployments", "default", "qwen25-7b")

    dep = await operator.wait_for(deployment, timeout=20)
    print(dep["metadata"])
    async def status():
        obj = await operator.get(crd.API_VERSION, crd.PLURAL, "default", "qwen25-7b")
        return obj.get("status", {}).get("phase")
    print(await operator.wait_for(status, timeout=20))
    obj = await operator.get(crd.API_VERSION, crd.PLURAL, "default", "qwen25-7b")
    print(obj)
    print([ (str(r.method), str(r.url)) for r in operator.writes()])
