"""A user's kubectl session against the sandbox: the real kubectl binary, the real operator, the emulated API.

What README's sandbox section invites a user to type after `scripts/sandbox --keep-running`, run with
the kubectl that scripts/bootstrap fetches (1.37): apply with validation (no flags), get, explain,
describe, wait, scale, an invalid apply refused with the field named, server-side dry runs that
store nothing, patch, `get -w`, Events, namespaces, delete with the children garbage-collected.
Every command must succeed without a warning on stderr.

No engine runs here (that is tests/e2e/test_sandbox.py's job): the pods of the local cluster are
not started, so the resource stays Progressing, and the Events come from a resource the operator
refuses. Everything kubectl does goes over HTTP to the same API the sandbox serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kmock import resource
from npu_operator.api import crd
from npu_operator.api.config import OperatorConfig
from npu_sandbox.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".cache" / "k8s-tools" / "bin" / "kubectl"
EXAMPLES = ROOT / "examples"
# The models are hostPath sources in the test's temporary directory: the policy lists it.
CONFIG = OperatorConfig(resync_seconds=1.0, metrics_port=0, health_port=0, allowed_host_paths=(tempfile.gettempdir(),))
NPUINF = resource(crd.GROUP, crd.VERSION, crd.PLURAL)

pytestmark = [
    pytest.mark.skipif(not KUBECTL.is_file(), reason="needs kubectl (scripts/bootstrap fetches it into .cache)"),
    pytest.mark.timeout(180),
]


class Kubectl:
    """The kubectl binary with the sandbox's kubeconfig and a clean home (no cached discovery)."""

    def __init__(self, cluster: LocalCluster, home: Path) -> None:
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(cluster.kubeconfig)}

    async def run(self, *args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = await asyncio.to_thread(
            subprocess.run, [str(KUBECTL), *args], input=stdin, capture_output=True, text=True, timeout=60, env=self.env
        )
        if ok:
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
            assert result.stderr == "", f"kubectl {' '.join(args)} warned: {result.stderr}"
        return result

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(KUBECTL), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, Kubectl]]:
    async with LocalCluster(workdir=tmp_path) as cluster:
        await cluster.start_operator(CONFIG)
        yield cluster, Kubectl(cluster, tmp_path / "home")
        await cluster.stop_operator()


def manifest(name: str, **spec: Any) -> str:
    document = yaml.safe_load((EXAMPLES / "sandbox-cpu.yaml").read_text(encoding="utf-8"))
    document["metadata"]["name"] = name
    for path, value in spec.items():
        *parents, leaf = path.split("__")
        node = document["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return yaml.safe_dump(document)


def never_stored(cluster: LocalCluster, namespace: str, name: str) -> bool:
    """Not in the store, not even as a deleted object's history (so no watcher saw it either)."""
    return (NPUINF, namespace, name) not in cluster.emulator.objects


async def finished(process: subprocess.Popen[str], within: float = 30.0) -> tuple[int, str, str]:
    out, err = await asyncio.to_thread(process.communicate, timeout=within)
    return process.returncode, out, err


async def test_a_users_kubectl_session(session: tuple[LocalCluster, Kubectl]) -> None:
    cluster, kubectl = session

    # No version-skew warning: the API says it is the Kubernetes whose schemas it serves.
    assert "Server Version: v1.37" in (await kubectl.run("version")).stdout

    # apply, validated without flags (kubectl reads the OpenAPI, the server validates strictly)
    applied = await kubectl.run("apply", "-f", str(EXAMPLES / "sandbox-cpu.yaml"))
    assert applied.stdout.strip() == "npuinference.inference.npu.dev/tiny-llama created"
    creates = [r for r in cluster.emulator.history if r.method.value == "POST" and r.resource == NPUINF]
    assert creates[-1].params.get("fieldValidation") == "Strict"

    again = await kubectl.run("apply", "-f", str(EXAMPLES / "sandbox-cpu.yaml"))
    assert again.stdout.strip() == "npuinference.inference.npu.dev/tiny-llama unchanged"
    listed = (await kubectl.run("get", "npuinf")).stdout.splitlines()
    assert listed[0].split() == ["NAME", "MODEL", "MODE", "READY", "PHASE", "REASON", "DOWNLOAD", "ADAPTERS", "AGE"]
    assert listed[1].split()[:2] == ["tiny-llama", "tiny-llama"]
    await kubectl.run("wait", "--for=condition=Progressing", "npuinf/tiny-llama", "--timeout=30s")
    deployments = await kubectl.run("get", "deploy", "tiny-llama")
    assert deployments.stdout.split()[:5] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]

    explained = (await kubectl.run("explain", "npuinf.spec.graph")).stdout
    assert "KIND:       NPUInference" in explained and "FIELDS:" in explained
    assert "captureSizes\t<[]integer>" in explained and "onDowngrade\t<string>" in explained
    assert "FIELD: containers <[]Container>" in (await kubectl.run("explain", "pod.spec.containers")).stdout

    # invalid manifests are refused by the server, the field named, nothing stored
    typo = await kubectl.run("apply", "-f", "-", stdin=manifest("typo", grph={"mode": "NONE"}), ok=False)
    assert typo.returncode == 1 and 'unknown field "spec.grph"' in typo.stderr, typo.stderr
    invalid = await kubectl.run("apply", "-f", "-", stdin=manifest("invalid", engine__maxNumSeqs=-3), ok=False)
    assert invalid.returncode == 1
    assert 'The NPUInference "invalid" is invalid: spec.engine.maxNumSeqs' in invalid.stderr, invalid.stderr
    assert never_stored(cluster, "default", "typo") and never_stored(cluster, "default", "invalid")

    # server-side dry runs: admitted and validated, answered, never stored
    dry = await kubectl.run("apply", "--dry-run=server", "-f", str(EXAMPLES / "qwen2.5-7b-910b.yaml"))
    assert dry.stdout.strip().endswith("created (server dry run)")
    assert never_stored(cluster, "default", "qwen25-7b")
    refused_dry = await kubectl.run(
        "apply", "--dry-run=server", "-f", "-", stdin=manifest("dry-invalid", engine__maxNumSeqs=0), ok=False
    )
    assert "spec.engine.maxNumSeqs" in refused_dry.stderr
    await kubectl.run(
        "patch", "npuinf", "tiny-llama", "--dry-run=server", "--type=merge", "-p", '{"spec":{"replicas":5}}'
    )
    await kubectl.run("scale", "npuinf", "tiny-llama", "--replicas=7", "--dry-run=server")
    await kubectl.run("delete", "npuinf", "tiny-llama", "--dry-run=server")
    diff = await kubectl.run("diff", "-f", "-", stdin=manifest("tiny-llama", replicas=3), ok=False)
    assert diff.returncode == 1 and "-  replicas: 1\n+  replicas: 3" in diff.stdout, diff.stderr  # a dry-run patch
    stored = await cluster.get(crd.API_VERSION, crd.PLURAL, "default", "tiny-llama")
    assert stored is not None and stored["spec"]["replicas"] == 1 and "deletionTimestamp" not in stored["metadata"]

    # scale: the scale subresource is an autoscaling/v1 Scale; the operator follows
    assert (await kubectl.run("scale", "npuinf", "tiny-llama", "--replicas=2")).stdout.strip().endswith("scaled")
    scale = json.loads(
        (
            await kubectl.run(
                "get", "--raw", "/apis/inference.npu.dev/v1alpha1/namespaces/default/npuinferences/tiny-llama/scale"
            )
        ).stdout
    )
    assert (scale["kind"], scale["apiVersion"], scale["spec"]["replicas"]) == ("Scale", "autoscaling/v1", 2)
    assert scale["status"]["selector"] == "app.kubernetes.io/name=npu-inference,inference.npu.dev/name=tiny-llama"
    await kubectl.run("wait", "--for=jsonpath={.spec.replicas}=2", "deploy/tiny-llama", "--timeout=30s")

    # get -w and wait follow a patch through the watch, without warnings
    generation = int((await kubectl.run("get", "npuinf", "tiny-llama", "-o", "jsonpath={.metadata.generation}")).stdout)
    watching = kubectl.start("get", "npuinf", "-w")
    waiting = kubectl.start(
        "wait", f"--for=jsonpath={{.status.observedGeneration}}={generation + 1}", "npuinf/tiny-llama", "--timeout=30s"
    )
    await asyncio.sleep(1.0)
    await kubectl.run("patch", "npuinf", "tiny-llama", "--type=merge", "-p", '{"spec":{"engine":{"maxNumSeqs":4}}}')
    code, out, err = await finished(waiting)
    assert (code, err) == (0, ""), err
    assert "condition met" in out
    await asyncio.sleep(2.0)
    watching.terminate()
    _, out, err = await finished(watching)
    assert err == "", err
    rows = out.splitlines()
    assert rows[0].split()[:3] == ["NAME", "MODEL", "MODE"] and len(rows) >= 3
    assert all(row.startswith("tiny-llama") for row in rows[1:])

    # Events, as `kubectl get events` and `describe` show them, from the operator by its name
    await kubectl.run(
        "apply", "-f", "-", stdin=manifest("refused", npu={"count": 1, "resourceName": "kubernetes.io/npu"})
    )
    await kubectl.run("wait", "--for=condition=Degraded", "npuinf/refused", "--timeout=30s")

    async def refused_event() -> list[str]:
        lines = (await kubectl.run("get", "events", "-o", "wide")).stdout.splitlines()
        return [line for line in lines if "npuinference/refused" in line]

    (row,) = await cluster.wait_for(refused_event, within=30)
    header = (await kubectl.run("get", "events")).stdout.splitlines()[0]
    assert header.split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert row.split()[1:5] == ["Warning", "InvalidSpec", "npuinference/refused", "npu-operator"]
    described = (await kubectl.run("describe", "npuinf", "refused")).stdout
    events = described[described.index("Events:") :].splitlines()
    assert events[1].split() == ["Type", "Reason", "Age", "From", "Message"]
    assert events[3].split()[:2] == ["Warning", "InvalidSpec"] and "npu-operator" in events[3].split()

    # namespaces are a resource
    assert "default" in (await kubectl.run("get", "ns")).stdout
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    await kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(namespace))
    assert (await kubectl.run("get", "ns", "team-a")).stdout.split()[3:5] == ["team-a", "Active"]

    # delete: kubectl waits until it is gone; the children go with it
    deleted = await kubectl.run("delete", "npuinf", "tiny-llama")
    assert deleted.stdout.startswith('npuinference.inference.npu.dev "tiny-llama" deleted')
    assert (await kubectl.run("get", "deploy,svc,pdb", "-o", "name")).stdout == ""
