"""status.model: the download of a hub source, folded from the fetch init containers' reports and the pods."""

from __future__ import annotations

import json
from typing import Any

from npu_operator.api.spec import HubSource
from npu_operator.status import findings as aggregate
from npu_operator.status.findings import PodReport
from npu_operator.status.model import model_status, progress_text
from npu_operator.status.reports import RuntimeReport, parse_report

HUB = HubSource("huggingface", "org/model", None, (), (), None, None)
COMMIT = "c" * 40


def report(phase: str, done: int, total: int = 1000, files: tuple[int, int] = (1, 5)) -> RuntimeReport:
    return parse_report(document(phase, done, total, files))


def document(phase: str, done: int, total: int = 1000, files: tuple[int, int] = (1, 5)) -> dict[str, Any]:
    return {
        "state": "fetching",
        "model": {
            "source": "huggingface",
            "repository": "org/model",
            "revision": COMMIT,
            "phase": phase,
            "bytesDone": done,
            "bytesTotal": total,
            "filesDone": files[0],
            "filesTotal": files[1],
        },
    }


def pod(name: str, init_state: dict[str, Any] | None = None, last: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if init_state is not None:
        status["initContainerStatuses"] = [{"name": "fetch-model", "state": init_state, "lastState": last or {}}]
    return {"metadata": {"name": name}, "status": status}


FAILED_INIT = {"terminated": {"exitCode": 2, "message": "ModelAccessDenied: huggingface org/model@main: refused\n"}}


def test_the_most_advanced_replica_shows_the_progress() -> None:
    reports = [PodReport("a", report("Waiting", 300)), PodReport("b", report("Downloading", 410, files=(2, 5)))]
    status = model_status(HUB, [pod("a"), pod("b")], reports, {})
    assert status == {
        "source": "huggingFace",
        "repository": "org/model",
        "revision": COMMIT,
        "bytesDone": 410,
        "bytesTotal": 1000,
        "filesDone": 2,
        "filesTotal": 5,
        "phase": "Downloading",
        "progress": "Downloading 41%",
    }


def test_a_finished_init_container_makes_the_model_ready_with_the_figures_seen_before() -> None:
    before = model_status(HUB, [pod("a")], [PodReport("a", report("Downloading", 999))], {})
    assert before is not None
    assert before["progress"] == "Downloading 99%"  # rounded down: 100% only when complete
    after = model_status(
        HUB, [pod("a", {"terminated": {"exitCode": 0}})], [PodReport("a", parse_report({"state": "ready"}))], before
    )
    assert after is not None
    assert (after["phase"], after["progress"], after["bytesDone"], after["filesDone"], after["revision"]) == (
        "Ready",
        "Ready",
        1000,
        5,
        COMMIT,
    )


def test_a_failed_download_names_its_reason_and_degrades_the_resource() -> None:
    pods = [pod("a", {"waiting": {"reason": "CrashLoopBackOff"}}, last=FAILED_INIT)]
    status = model_status(HUB, pods, [], {})
    assert status is not None
    assert (status["phase"], status["reason"], status["progress"]) == (
        "Failed",
        "ModelAccessDenied",
        "Failed (ModelAccessDenied)",
    )
    assert "org/model" in status["message"]
    findings = aggregate.pod_findings(pods, [], None)
    assert findings.worst is not None and findings.worst.reason == "ModelAccessDenied"
    assert "org/model" in findings.worst.message


def test_an_init_container_that_failed_once_and_then_finished_is_not_a_problem() -> None:
    pods = [pod("a", {"terminated": {"exitCode": 0}}, last=FAILED_INIT)]
    assert aggregate.pod_findings(pods, [], None).worst is None
    status = model_status(HUB, pods, [], {})
    assert status is not None and status["phase"] == "Ready"


def test_nothing_reported_yet_is_pending_and_a_volume_source_has_no_model_status() -> None:
    status = model_status(HUB, [pod("a")], [PodReport("a", None, reachable=False)], {})
    assert status == {"source": "huggingFace", "repository": "org/model", "phase": "Pending", "progress": "Pending"}
    assert model_status(None, [pod("a")], [], {}) is None


def test_another_repository_starts_from_scratch() -> None:
    other = {"source": "huggingFace", "repository": "org/old", "revision": "x", "bytesTotal": 5, "phase": "Ready"}
    status = model_status(HUB, [], [], other)
    assert status == {"source": "huggingFace", "repository": "org/model", "phase": "Pending", "progress": "Pending"}


def test_progress_text() -> None:
    assert progress_text({"phase": "Downloading", "bytesDone": 0, "bytesTotal": 0}) == "Downloading"
    assert progress_text({"phase": "Downloading", "bytesDone": 1, "bytesTotal": 3}) == "Downloading 33%"
    assert progress_text({"phase": "Failed"}) == "Failed"


def test_a_download_shorter_than_a_poll_is_known_from_its_termination_message() -> None:
    result = document("Ready", 1000, files=(5, 5))["model"]
    finished = {"terminated": {"exitCode": 0, "message": "ModelReady: " + json.dumps(result) + "\n"}}
    status = model_status(HUB, [pod("a", finished)], [PodReport("a", parse_report({"state": "loading"}))], {})
    assert status is not None
    assert (status["phase"], status["revision"], status["bytesDone"], status["filesTotal"]) == (
        "Ready",
        COMMIT,
        1000,
        5,
    )


def test_a_stale_downloading_report_does_not_hide_a_finished_fetch() -> None:
    finished = pod("a", {"terminated": {"exitCode": 0}})
    status = model_status(HUB, [finished], [PodReport("a", report("Downloading", 400), reachable=False)], {})
    assert status is not None and status["phase"] == "Ready" and status["bytesDone"] == 1000
