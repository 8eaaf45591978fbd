"""Validation of prometheus-operator objects (monitoring.coreos.com/v1), which kubernetes-validate
does not know: they are CRDs, not Kubernetes' own kinds.

The models come from `cloudcoil-models-prometheus-operator`, pydantic classes generated from
prometheus-operator's own CRD schemas (types, enums, required fields). Pydantic ignores fields
it does not know and coerces some values, so the check is a round trip: the object must come
back from the model exactly as it went in; an unknown or misspelt field, or a value of the
wrong type, shows up as a difference with its path.
"""

from __future__ import annotations

from typing import Any, Final

GROUP: Final = "monitoring.coreos.com"


def validate(obj: dict[str, Any]) -> None:
    from cloudcoil.models.prometheus_operator import v1

    kinds = {"PodMonitor": v1.PodMonitor, "ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}
    if obj.get("apiVersion") != f"{GROUP}/v1" or obj.get("kind") not in kinds:
        raise ValueError(
            f"not a {GROUP}/v1 PodMonitor, ServiceMonitor or PrometheusRule: {obj.get('apiVersion')} {obj.get('kind')}"
        )
    model: Any = kinds[obj["kind"]].model_validate(obj)  # type: ignore[attr-defined]
    back = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    differences = list(_differences(obj, back, ""))
    if differences:
        raise ValueError(f"{obj['kind']} {obj['metadata'].get('name')}: " + "; ".join(differences))


def _differences(given: Any, back: Any, path: str) -> Any:
    if isinstance(given, dict) and isinstance(back, dict):
        for key, value in given.items():
            where = f"{path}.{key}" if path else key
            if key not in back:
                yield f"{where}: unknown field"
            else:
                yield from _differences(value, back[key], where)
    elif isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        for index, (a, b) in enumerate(zip(given, back, strict=True)):
            yield from _differences(a, b, f"{path}[{index}]")
    elif given != back or type(given) is not type(back):
        yield f"{path}: {given!r} read as {back!r}"
