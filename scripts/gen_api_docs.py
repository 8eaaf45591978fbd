"""Write docs/api.md, the NPUInference field reference, from the CRD's own descriptions.

Run after changing the CRD: `.venv/bin/python scripts/gen_api_docs.py`. A test fails when the
committed file is out of date, so the reference never drifts from the schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from npu_operator.api import crd

TARGET = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def cell(text: str) -> str:
    """Table-safe text: a pipe would end the cell."""
    return text.replace("|", "\\|")


def rows(schema: dict[str, Any], path: str) -> list[str]:
    lines = []
    for key, sub in schema.get("properties", {}).items():
        here = f"{path}.{key}"
        kind = sub.get("type") or ("int or string" if sub.get("x-kubernetes-int-or-string") else "object")
        if kind == "array":
            kind = f"array of {sub.get('items', {}).get('type', 'object')}"
        facts = []
        if "default" in sub:
            facts.append(f"default `{json.dumps(sub['default'])}`")
        if "enum" in sub:
            facts.append("one of " + ", ".join(f"`{v}`" for v in sub["enum"] if v != ""))
        if "minimum" in sub or "maximum" in sub:
            low = sub.get("minimum", "")
            facts.append(f"range {'(' if sub.get('exclusiveMinimum') else '['}{low}, {sub.get('maximum', '')}]")
        if key in schema.get("required", []):
            facts.append("required")
        description = " ".join(sub.get("description", "").split())
        lines.append(f"| `{here}` | {kind} | {cell(description)} | {cell('; '.join(facts))} |")
        lines += rows(sub, here)
        if "items" in sub:
            lines += rows(sub["items"], here + "[]")
    return lines


def render() -> str:
    schema = crd.openapi_schema()
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    rules = []
    for path, node in walk(schema, ""):
        for rule in node.get("x-kubernetes-validations", []):
            message = rule.get("message") or rule.get("messageExpression", "")
            rule_text = " ".join(rule["rule"].split())
            rules.append(f"| `{path or '(root)'}` | `{cell(rule_text)}` | {cell(' '.join(message.split()))} |")
    return "\n".join(
        [
            "# NPUInference API reference (inference.npu.dev/v1alpha1)",
            "",
            "Generated from `crds/inference.npu.dev_npuinferences.yaml` by `scripts/gen_api_docs.py`; do not edit.",
            "`kubectl explain npuinf.spec` shows the same descriptions in a cluster and in the sandbox.",
            "",
            "## spec",
            "",
            "| field | type | description | constraints |",
            "| --- | --- | --- | --- |",
            *rows(spec, "spec"),
            "",
            "## Cross-field rules (CEL, checked by the API server)",
            "",
            "| where | rule | message |",
            "| --- | --- | --- |",
            *rules,
            "",
            "## status",
            "",
            "| field | type | description | constraints |",
            "| --- | --- | --- | --- |",
            *rows(status, "status"),
            "",
        ]
    )


def walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for key, sub in schema.get("properties", {}).items():
        found += walk(sub, f"{path}.{key}" if path else key)
    if "items" in schema:
        found += walk(schema["items"], f"{path}[]")
    return found


if __name__ == "__main__":
    TARGET.write_text(render(), encoding="utf-8")
    print(TARGET)
