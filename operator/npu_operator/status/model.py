"""`status.model`: the download of a Hugging Face or ModelScope source, folded from the pods. Pure.

While a pod's init container (`npu-runtime fetch`) runs, its `/status` answers `{"model": {...}}`
with the phase, the revision it resolved to, and bytes and files done and total; every replica
shows the same download (the ones waiting on the cache's lock copy the downloader's progress), so
the fold takes the most advanced report. A fetch that finished leaves its final progress in the
init container's termination message (`ModelReady: {...}`), so even a download shorter than a
poll (or none: the cache was complete) shows its revision and size. A fetch that failed leaves
`<Reason>: <message>` there instead (see `findings.fetch_cause`). Figures seen before stay when
no pod reports any (a restart does not make the total disappear).

`progress` is what `kubectl get npuinf` prints: `Downloading 41%`, `Ready`, `Failed (Reason)`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_runtime.fetch import download as fetch

from npu_operator.api.spec import HubSource
from npu_operator.status.findings import PodReport, fetch_cause, fetch_finished
from npu_operator.status.reports import ModelProgress, parse_model_progress

JSON = dict[str, Any]

SOURCE_FIELDS: Final = {"huggingface": "huggingFace", "modelscope": "modelScope"}
DOWNLOADING: Final = "Downloading"
READY: Final = "Ready"
FAILED: Final = "Failed"
PENDING: Final = "Pending"
_FIGURES: Final = ("bytesDone", "bytesTotal", "filesDone", "filesTotal")


def model_status(
    hub: HubSource | None,
    pods: Sequence[Mapping[str, Any]],
    reports: Sequence[PodReport],
    previous: Mapping[str, Any],
) -> JSON | None:
    """The new `status.model`, or None for a source that is not a hub repository."""
    if hub is None:
        return None
    source = SOURCE_FIELDS[hub.hub]
    same = previous.get("source") == source and previous.get("repository") == hub.repository
    before: Mapping[str, Any] = previous if same else {}
    status: JSON = {"source": source, "repository": hub.repository}
    if revision := before.get("revision") or hub.revision:
        status["revision"] = revision
    status.update({key: before[key] for key in _FIGURES if key in before})

    seen = [r.report.model for r in reports if r.report is not None and r.report.model is not None]
    seen += [result for pod in pods if (result := fetch_result(pod)) is not None]
    seen = [m for m in seen if m.repository == hub.repository]
    failed = [cause for pod in pods if (cause := fetch_cause(pod)) is not None]
    fetched = any(_fetched(pod) for pod in pods)
    running = [m for m in seen if m.phase not in (READY, FAILED)]
    latest = max(seen, key=lambda m: (m.bytes_done, m.files_done), default=None)
    if latest is not None:
        if latest.revision:
            status["revision"] = latest.revision
        status.update(
            bytesDone=latest.bytes_done,
            bytesTotal=latest.bytes_total,
            filesDone=latest.files_done,
            filesTotal=latest.files_total,
        )

    # One finished fetch means the revision is complete in the shared cache (a pod's last fetch report,
    # which the collector keeps while the pod does not answer, may still say Downloading).
    if failed and not fetched:
        reason, message = failed[0]
        status.update(phase=FAILED, reason=reason, message=message)
    elif fetched or (not running and (any(m.phase == READY for m in seen) or before.get("phase") == READY)):
        status["phase"] = READY
        if "bytesTotal" in status:
            status["bytesDone"] = status["bytesTotal"]
        if "filesTotal" in status:
            status["filesDone"] = status["filesTotal"]
    elif running:
        status["phase"] = DOWNLOADING
    else:
        status["phase"] = PENDING
    status["progress"] = progress_text(status)
    return status


def progress_text(status: Mapping[str, Any]) -> str:
    """The printer column: `Downloading 41%` (rounded down: 100% only when complete), or the phase."""
    phase = str(status.get("phase", PENDING))
    total = int(status.get("bytesTotal", 0))
    if phase == DOWNLOADING and total > 0:
        return f"{DOWNLOADING} {int(status.get('bytesDone', 0)) * 100 // total}%"
    if phase == FAILED and status.get("reason"):
        return f"{FAILED} ({status['reason']})"
    return phase


def fetch_result(pod: Mapping[str, Any]) -> ModelProgress | None:
    """The final progress a finished download left in its termination message (`ModelReady: {...}`)."""
    for entry in pod.get("status", {}).get("initContainerStatuses", []):
        if fetch_finished(entry):
            message = str((entry["state"]["terminated"]).get("message", ""))
            head, _, payload = message.strip().partition(": ")
            if head == fetch.READY:
                with contextlib.suppress(ValueError):
                    return parse_model_progress(json.loads(payload))
    return None


def _fetched(pod: Mapping[str, Any]) -> bool:
    return any(fetch_finished(entry) for entry in pod.get("status", {}).get("initContainerStatuses", []))
