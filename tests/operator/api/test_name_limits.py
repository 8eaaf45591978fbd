"""metadata.name against the names upstream controllers derive from it (`npu_operator.api.name_limits`).

Each limit is checked from both sides: at the limit every name that `tests/operator/upstream_names`
derives from the rendered children is valid, one character past it the operator refuses the name
and the same derivation finds a name Kubernetes would refuse. Upstream's own test cases for the
names we depend on are ported as data, with where they come from.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml
from npu_operator.api import name_limits
from npu_operator.api.spec import parse_spec
from npu_operator.children import kinds
from npu_operator.cli import main
from npu_operator.controller.desired import adopted_children, read_spec

from tests.examples import EXAMPLES, SANDBOX_HOST_PATHS, TEST_CONFIG, example
from tests.upstream import derived_names as upstream_names

UID = "11111111-2222-3333-4444-555555555555"

# -- upstream's cases, as data ---------------------------------------------------------------------------

# kedacore/keda v2.20.2, apis/keda/v1alpha1/scaledobject_webhook_test.go, the cases of verifyName:
# (ScaledObject name length, spec.advanced.horizontalPodAutoscalerConfig.name, accepted).
KEDA_VERIFY_NAME = [
    (64, "short-hpa", False),  # "shouldn't validate the so creation when the name exceeds the label value limit"
    (63, "short-hpa", True),  # "should validate ... the name is at the label value limit and a custom HPA name is set"
    (55, "", False),  # "... no custom HPA name is set and the generated HPA name would exceed the label value limit"
    (54, "", True),  # "... no custom HPA name is set and the generated HPA name fits within the label value limit"
    (60, "", False),  # "shouldn't validate the so update when removing the custom HPA name would make ... exceed"
]
# kubernetes-sigs/lws v0.10.0, test/integration/webhooks/leaderworkerset_test.go: "creation with invalid
# name should fail" (2cube); test/wrappers/wrappers.go BuildLeaderWorkerSet's own name is accepted.
LWS_NAMES = [("test-sample", True), ("2cube", False)]
# test/testutils/validators.go ExpectValidServices: with UniquePerReplica, one Service <lws>-<i> per
# replica; BuildLeaderWorkerSet makes test-sample with 2 replicas of size 2.
LWS_GROUP_SERVICES = ("test-sample", 2, ["test-sample-0", "test-sample-1"])
# test/testutils/util.go CreateWorkerPodsForLeaderPod: worker i of a group is <leader pod>-<i>, 1..size-1.
LWS_WORKER_PODS = ("test-sample-0", 2, ["test-sample-0-1"])
# pkg/controllers/disaggregatedset/service_manager_test.go "service name uses prv prefix".
DS_SERVICES = [
    ("my-app", "ef53f2d7", "prefill", "my-app-0-ef53f2d7-prefill-prv"),
    ("my-app", "ef53f2d7", "decode", "my-app-0-ef53f2d7-decode-prv"),
]


def scaled_object(name: str, hpa: str) -> dict[str, Any]:
    advanced = {"horizontalPodAutoscalerConfig": {"name": hpa}} if hpa else {}
    return {"kind": "ScaledObject", "metadata": {"name": name}, "spec": {"advanced": advanced}}


@pytest.mark.parametrize(("length", "hpa", "accepted"), KEDA_VERIFY_NAME)
def test_the_helper_reads_names_as_kedas_webhook_does(length: int, hpa: str, accepted: bool) -> None:
    names = upstream_names.keda_names(scaled_object("a" * length, hpa))
    assert all(name.problem() is None for name in names) is accepted


@pytest.mark.parametrize(("length", "accepted"), [(n, ok) for n, hpa, ok in KEDA_VERIFY_NAME if not hpa])
def test_an_autoscaled_name_is_refused_where_keda_refuses_its_scaled_object(length: int, accepted: bool) -> None:
    # The operator never names the HPA itself: KEDA's own keda-hpa-<name> is the name that counts.
    manifest = named(example("qwen2.5-7b-910b.yaml"), "a" * length)
    problems = [str(p) for p in read_spec(manifest, TEST_CONFIG)[1]]
    assert (problems == []) is accepted, problems
    if accepted:
        [scaled] = [c for c in rendered(manifest) if c["kind"] == "ScaledObject"]
        assert upstream_names.hpa_name(scaled) == "keda-hpa-" + "a" * length
    else:
        assert len(problems) == 1 and problems[0].startswith(problem_text(length, 54)), problems
        assert problems[0].endswith("Choose a name of at most 54 characters, or remove spec.autoscaling")


@pytest.mark.parametrize(("name", "accepted"), LWS_NAMES)
def test_the_helper_reads_a_leader_worker_set_name_as_its_webhook(name: str, accepted: bool) -> None:
    assert (upstream_names.lws_names(name, 1, 1)[0].problem() is None) is accepted


def test_the_helper_names_lws_services_and_worker_pods_as_lws_tests_expect() -> None:
    lws, replicas, services = LWS_GROUP_SERVICES
    found = upstream_names.lws_names(lws, replicas, 2, "UniquePerReplica")
    assert sorted({n.value for n in found if n.what.startswith("headless Service")}) == services
    leader, size, workers = LWS_WORKER_PODS
    pods = upstream_names.statefulset_names(leader, range(1, size), "worker")
    assert sorted({n.value for n in pods if n.what.startswith("hostname")}) == workers


@pytest.mark.parametrize(("ds", "revision", "role", "service"), DS_SERVICES)
def test_the_helper_names_the_role_services_as_the_disaggregated_set(
    ds: str, revision: str, role: str, service: str
) -> None:
    assert upstream_names.ds_service_name(ds, role, 0, revision) == service


# -- per topology: one character under passes, one over is refused ------------------------------------------


def named(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"] = {**manifest["metadata"], "name": name, "uid": UID}
    return manifest


def rendered(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The children, built even for a spec the operator refuses (to see what would break)."""
    spec = parse_spec(manifest["spec"])
    return adopted_children(manifest, spec, TEST_CONFIG, kinds.Capabilities.everything())


def problem_text(length: int, limit: int) -> str:
    return f"metadata.name: {'a' * length!r} is {length} characters; with this spec at most {limit} fit."


def changed(name: str, change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    manifest = example(name)
    if change is not None:
        change(manifest["spec"])
    return manifest


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return change


def pd_autoscaled(decode: int) -> Callable[[dict[str, Any]], None]:
    """spec.autoscaling of a P/D resource up to `decode` replicas: KEDA may make that many decode groups."""

    def change(spec: dict[str, Any]) -> None:
        spec["autoscaling"] = {"maxReplicas": decode}
        spec["metrics"] = {"podMonitor": {"enabled": True}}

    return change


# (case, manifest, limit, the derived name that sets it). The arithmetic (63 minus what each adds):
# Deployment 63; KEDA keda-hpa-<name> 63-9 = 54; LeaderWorkerSet of nodes > 1: the worker pods'
# controller-revision-hash <name>-<group>-<hash>, 63-(1+G+1+10) = 51-G for G group-index digits;
# DisaggregatedSet, role LeaderWorkerSet <name>-0-<8>-<role> (12 + len(role) more): a group of one
# node, its leader pods' label <lws>-<hash>, 63-(19+11) = 33 for prefill; of more nodes, its worker
# pods' label <lws>-<group>-<hash>, 63-(18+1+G+11) = 32 (decode, G=1).
LIMITS = [
    ("single-node", changed("sandbox-cpu.yaml"), 63, "workload"),
    ("single-node-autoscaled", changed("qwen2.5-7b-910b.yaml"), 54, "HorizontalPodAutoscaler"),
    ("multi-node", changed("sandbox-cpu-2node.yaml"), 50, "worker pods' controller-revision-hash"),
    ("multi-node-10", changed("sandbox-cpu-2node.yaml", _set("replicas", 10)), 50, "worker pods'"),
    ("multi-node-11", changed("sandbox-cpu-2node.yaml", _set("replicas", 11)), 49, "worker pods'"),
    ("multi-node-101", changed("sandbox-cpu-2node.yaml", _set("replicas", 101)), 48, "worker pods'"),
    ("multi-node-autoscaled", changed("deepseek-r1-w8a8-2node.yaml"), 50, "worker pods'"),
    (
        "multi-node-autoscaled-to-11",
        changed("deepseek-r1-w8a8-2node.yaml", _set("autoscaling.maxReplicas", 11)),
        49,
        "worker pods'",
    ),
    ("disaggregated-one-node-roles", changed("sandbox-cpu-pd.yaml"), 33, "prefill LeaderWorkerSet's leader pods'"),
    ("disaggregated", changed("deepseek-r1-w8a8-pd.yaml"), 32, "decode LeaderWorkerSet's worker pods'"),
    (
        "disaggregated-autoscaled-to-11-decode-groups",
        changed("deepseek-r1-w8a8-pd.yaml", pd_autoscaled(11)),
        31,
        "decode LeaderWorkerSet's worker pods'",
    ),
    (
        "disaggregated-11-decode-groups",
        changed("deepseek-r1-w8a8-pd.yaml", _set("replicas", 11)),
        31,
        "decode LeaderWorkerSet's worker pods'",
    ),
]


@pytest.mark.parametrize(("manifest", "limit", "binding"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_the_limit_is_what_upstream_bears(manifest: dict[str, Any], limit: int, binding: str) -> None:
    spec = parse_spec(manifest["spec"])
    assert name_limits.name_limit(spec) == limit
    assert binding in name_limits.binding(spec).what

    at = named(manifest, "a" * limit)
    assert read_spec(at, TEST_CONFIG)[1] == []
    assert upstream_names.problems(rendered(at)) == []

    past = named(manifest, "a" * (limit + 1))
    [problem] = [p for p in read_spec(past, TEST_CONFIG)[1] if p.field == "metadata.name"]
    assert str(problem).startswith(problem_text(limit + 1, limit))
    assert f"Choose a name of at most {limit} characters" in str(problem)
    assert upstream_names.problems(rendered(past)), "one past the limit nothing breaks: the limit is too tight"


def test_the_message_names_the_object_the_rule_and_the_upstream_function() -> None:
    spec = parse_spec(example("sandbox-cpu-2node.yaml")["spec"])
    [problem] = name_limits.name_problems("a" * 51, spec)
    assert str(problem) == (
        f"metadata.name: {'a' * 51!r} is 51 characters; with this spec at most 50 fit. The LeaderWorkerSet's "
        "worker pods' controller-revision-hash label, <name>-<group>-<hash> (<group> up to 0, <hash> up to 10 "
        "characters), would be 64 characters, more than the 63 of a label value: the StatefulSet controller "
        "cannot create these pods (StatefulSet controller ControllerRevisionName, HashControllerRevision, "
        "setPodRevision; each worker StatefulSet is named after its leader pod, pod_controller.go "
        "constructWorkerStatefulSetApplyConfiguration). Choose a name of at most 50 characters"
    )


def test_without_a_name_the_spec_alone_is_checked() -> None:
    from npu_operator.api.validation import validate_spec

    spec = parse_spec(example("deepseek-r1-w8a8-pd.yaml")["spec"])
    assert validate_spec(spec) == []
    assert [p.field for p in validate_spec(spec, "a" * 40)] == ["metadata.name"]


# -- render every example, as named and renamed to 63 characters ----------------------------------------------

RENDER_SETTINGS = {
    "NPU_OPERATOR_ALLOWED_HOST_PATHS": ",".join(SANDBOX_HOST_PATHS),
    "NPU_OPERATOR_ALLOWED_PRIORITY_CLASSES": "inference-high",  # qwen2.5-32b-tp4's, as its comment says
}


def render_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    for key, value in RENDER_SETTINGS.items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["render", "--all-apis", "-f", str(path)])
    return code, out.getvalue(), err.getvalue()


def sixty_three(name: str) -> str:
    return f"{name}-{'n' * (62 - len(name))}"


@pytest.mark.parametrize("example_name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
@pytest.mark.parametrize("rename", [False, True], ids=["as-named", "63-characters"])
def test_every_example_renders_only_valid_upstream_names_or_is_refused_by_name(
    example_name: str, rename: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = example(example_name)
    name = sixty_three(manifest["metadata"]["name"]) if rename else manifest["metadata"]["name"]
    manifest["metadata"]["name"] = name
    path = tmp_path / example_name
    path.write_text(yaml.safe_dump(manifest), encoding="utf-8")
    code, out, err = render_file(path, monkeypatch)
    limit = name_limits.name_limit(parse_spec(manifest["spec"]))
    if len(name) <= limit:
        assert code == 0, err
        children = [c for c in yaml.safe_load_all(out) if c]
        assert children and upstream_names.problems(children) == []
    else:
        assert code == 2 and out.strip() in ("", "[]", "{}"), (code, out)
        assert f"  metadata.name: {name!r} is {len(name)} characters; with this spec at most {limit} fit." in err
        assert [line for line in err.splitlines() if line.startswith("  ")] == [
            line for line in err.splitlines() if line.startswith("  metadata.name:")
        ], err


def test_every_example_fits_its_limit_as_named_and_the_long_ones_are_the_upstream_topologies() -> None:
    refused_at_63 = set()
    for path in sorted(EXAMPLES.glob("*.yaml")):
        manifest = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = parse_spec(manifest["spec"])
        assert len(manifest["metadata"]["name"]) <= name_limits.name_limit(spec), path.name
        if name_limits.name_limit(spec) < 63:
            refused_at_63.add(path.name)
    assert refused_at_63 == {
        "deepseek-r1-w8a8-2node.yaml",  # LeaderWorkerSet
        "deepseek-r1-w8a8-pd.yaml",  # DisaggregatedSet
        "qwen2.5-7b-910b.yaml",  # KEDA
        "sandbox-cpu-2node.yaml",
        "sandbox-cpu-pd.yaml",
    }


# -- our own children's names: shortened once, the same on every reconcile ------------------------------------


@pytest.mark.parametrize("example_name", ["qwen2.5-7b-910b.yaml", "sandbox-cpu-pd.yaml"])
def test_long_names_give_the_same_children_on_every_reconcile(example_name: str) -> None:
    manifest = example(example_name)
    manifest["spec"].pop("autoscaling", None)  # KEDA's limit aside: the longest name the CRD takes
    long_name = sixty_three(manifest["metadata"]["name"])
    first, again = rendered(named(manifest, long_name)), rendered(named(manifest, long_name))
    assert [(c["kind"], c["metadata"]["name"]) for c in first] == [(c["kind"], c["metadata"]["name"]) for c in again]
    for child in first:
        assert len(child["metadata"]["name"]) <= 63
        assert kinds.kind_of(child, long_name).child_name(long_name) == child["metadata"]["name"]
    picker = [c["metadata"]["name"] for c in first if c["metadata"]["name"].endswith(kinds.PICKER_SUFFIX)]
    assert not routing_in(manifest) or picker


def routing_in(manifest: dict[str, Any]) -> bool:
    return manifest["spec"].get("routing") is not None
