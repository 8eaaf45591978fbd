"""`status.adapters`: each LoRA adapter of spec.lora, and which of the ready pods hold it. Pure.

Every engine pod's runtime reports the adapters of its list (`npu_runtime.serving.lora`): loaded,
failed (with the runtime's reason and the engine's or the check's message) or pending (being
fetched or loaded). The fold counts, per adapter of the spec, the ready pods whose current report
says loaded; the first failure seen names the reason. An adapter a pod does not report yet (its
ConfigMap not synced, or an older runtime) is pending there.

`status.adaptersReady` ("2/3": adapters loaded on every ready pod, of those listed) is what
`kubectl get npuinf` prints. The AdapterFailed condition is True while an adapter failed on some
pod, naming each with its message (a Warning Event when it turns on); the other adapters keep
serving, and nothing else is degraded by it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from npu_operator.api.spec import NPUInferenceSpec
from npu_operator.kube.objects import is_true
from npu_operator.status.findings import PodReport
from npu_operator.status.reports import AdapterReport

JSON = dict[str, Any]

ADAPTER_FAILED: Final = "AdapterFailed"
LOADED: Final = "Loaded"
FAILED: Final = "Failed"
PENDING: Final = "Pending"
MAX_NAMED: Final = 4  # adapters named in the condition's message


def adapters_status(
    spec: NPUInferenceSpec, pods: Sequence[Mapping[str, Any]], reports: Sequence[PodReport]
) -> tuple[list[JSON], str | None]:
    """(status.adapters, the AdapterFailed message or None) for the ready pods' current reports."""
    if spec.lora is None:
        return [], None
    ready = {str(pod["metadata"]["name"]) for pod in pods if is_true(pod, "Ready")}
    held: dict[str, dict[str, AdapterReport]] = {}  # pod -> adapter name -> report
    for report in reports:
        current = report.current
        if report.pod in ready and current is not None:
            held[report.pod] = {adapter.name: adapter for adapter in current.adapters}
    entries = [_entry(adapter.name, held, len(ready)) for adapter in spec.lora.adapters]
    failed = [entry for entry in entries if entry["state"] == FAILED]
    if not failed:
        return entries, None
    named = [f"{e['name']} ({e['reason']}: {e.get('message', 'no message')})" for e in failed[:MAX_NAMED]]
    more = f" and {len(failed) - MAX_NAMED} more" if len(failed) > MAX_NAMED else ""
    return entries, f"LoRA adapters not served: {'; '.join(named)}{more}; the others keep serving"


def _entry(name: str, held: Mapping[str, Mapping[str, AdapterReport]], ready: int) -> JSON:
    reports = [by_name[name] for by_name in held.values() if name in by_name]
    loaded = sum(1 for report in reports if report.state == "loaded")
    failure = next((report for report in reports if report.state == "failed"), None)
    entry: JSON = {"name": name, "pods": f"{loaded}/{ready}"}
    if failure is not None:
        entry.update(state=FAILED, reason=failure.reason or "AdapterFailed")
        if failure.message:
            entry["message"] = failure.message
    elif ready and loaded == ready:
        entry["state"] = LOADED
    else:
        entry["state"] = PENDING
        pending = next((report for report in reports if report.state == "pending" and report.reason), None)
        if pending is not None:
            entry["reason"] = pending.reason
    return entry


def adapters_ready(entries: Sequence[Mapping[str, Any]]) -> str:
    """`kubectl get npuinf`'s column: adapters loaded on every ready pod, of those listed ("2/3")."""
    return f"{sum(1 for entry in entries if entry['state'] == LOADED)}/{len(entries)}"
