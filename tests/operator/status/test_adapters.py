"""status.adapters and the AdapterFailed condition, folded from the ready pods' runtime reports."""

from __future__ import annotations

from typing import Any

from npu_operator.api.spec import parse_spec
from npu_operator.status.adapters import adapters_ready, adapters_status
from npu_operator.status.findings import PodReport
from npu_operator.status.reports import parse_report
from npu_operator.status.resource import adapter_condition, transition_events

from tests.examples import example


def spec() -> Any:
    manifest = example("qwen2.5-7b-lora.yaml")
    return parse_spec(manifest["spec"])


def pod(name: str, ready: bool = True) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": {"name": name}, "status": {"conditions": [condition]}}


def report(name: str, *adapters: dict[str, Any]) -> PodReport:
    return PodReport(name, parse_report({"state": "ready", "adapters": list(adapters)}))


LOADED = {"state": "loaded"}


def test_an_adapter_on_every_ready_pod_is_loaded_and_one_on_some_is_pending() -> None:
    pods = [pod("p0"), pod("p1"), pod("p2", ready=False)]
    reports = [
        report("p0", {"name": "sql", **LOADED}, {"name": "support-chat", **LOADED}),
        report("p1", {"name": "sql", **LOADED}, {"name": "support-chat", "state": "pending", "reason": "Fetching"}),
        report("p2"),  # not ready: not counted
    ]
    entries, failed = adapters_status(spec(), pods, reports)
    assert entries == [
        {"name": "sql", "pods": "2/2", "state": "Loaded"},
        {"name": "support-chat", "pods": "1/2", "state": "Pending", "reason": "Fetching"},
        {"name": "summarize", "pods": "0/2", "state": "Pending"},
    ]
    assert failed is None and adapters_ready(entries) == "1/3"


def test_a_failed_adapter_names_the_engines_message_and_turns_the_condition_on_once() -> None:
    message = "Call to add_lora method failed: LoRA rank 128 is greater than max_lora_rank 64."
    reports = [
        report(
            "p0",
            {"name": "sql", **LOADED},
            {"name": "summarize", "state": "failed", "reason": "AdapterLoadFailed", "message": message},
        )
    ]
    entries, failed = adapters_status(spec(), [pod("p0")], reports)
    assert entries[2] == {
        "name": "summarize",
        "pods": "0/1",
        "state": "Failed",
        "reason": "AdapterLoadFailed",
        "message": message,
    }
    assert entries[0]["state"] == "Loaded"
    assert failed is not None and "summarize (AdapterLoadFailed: " + message in failed
    on = adapter_condition(failed)
    as_stored = [{"type": on.type, "status": "True", "reason": on.reason, "message": on.message}]
    events = transition_events([], as_stored)
    assert [(e.type, e.reason) for e in events] == [("Warning", "AdapterFailed")]
    assert transition_events(as_stored, as_stored) == []


def test_a_lying_report_loses_only_its_bad_entries() -> None:
    checked = parse_report(
        {
            "adapters": [
                {"name": "ok", "state": "loaded"},
                {"name": "x\ny", "state": "loaded"},
                {"name": "z", "state": "hacked"},
                7,
            ]
        }
    )
    assert [a.name for a in checked.adapters] == ["ok"] and checked.dropped == 3


def test_no_lora_no_adapters() -> None:
    manifest = example("qwen2.5-7b-910b.yaml")
    assert adapters_status(parse_spec(manifest["spec"]), [pod("p0")], [report("p0")]) == ([], None)
