"""Every Grafana panel's queries answered by a real Prometheus holding what the sandbox scraped: how.

The test itself is in test_sandbox.py, beside the other judges of the one sandbox run (a session
fixture: in one file, the engine tests' workers, `--dist loadfile`, start it once). Here: how a
panel is asked, and the Grafana interpolation it follows.

The sandbox run (tests/e2e/conftest.py) leaves Prometheus' TSDB in its workdir: a day in the life
of one NPUInference on CPU, Ready, serving one completion. A fresh Prometheus opens a copy of it,
and each panel's queries run the way Grafana would send them for that namespace and resource:
`$namespace` and `$npuinference` substituted as Grafana interpolates a multi-value variable into
PromQL (regex-escaped), `$__rate_interval` as max($__interval + scrape interval, 4 x scrape
interval), `$__range` as the run's length, range queries over the run for time series, instant
queries for tables. A panel has data when some series has a number. Panels listed in the
dashboard's NPU_ONLY can only have data on an NPU (graph capture and replay); on CPU they must be
empty, every other panel must answer.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Any

from npu_sandbox.demo import prometheus
from npu_sandbox.node.network import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "npu-inference-operator" / "files" / "dashboards" / "npu-inference.json"


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_dashboard", ROOT / "scripts" / "gen_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def regex_escape(value: str) -> str:
    """Grafana's prometheusSpecialRegexEscape: a variable value inside a =~ matcher's quotes."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


Selection = dict[str, list[str] | str]  # variable -> the values selected, or "All" (its allValue, verbatim)


def interpolate(
    expr: str, variables: Selection, step: float, scrape: float, all_values: dict[str, str], range_seconds: float = 3600
) -> str:
    """The expression as Grafana sends it (multi-value variables with "All": one or more values, or
    All; `$__range` the dashboard's time range, in seconds)."""
    for name, values in variables.items():
        if values == "All":
            value = all_values[name]
        else:
            escaped = [regex_escape(v) for v in values]
            value = escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        expr = expr.replace(f"${name}", value)
    rate_interval = max(step + scrape, 4 * scrape)
    expr = expr.replace("$__rate_interval", f"{rate_interval:g}s").replace("$__range", f"{round(range_seconds)}s")
    return expr.replace("$__interval", f"{step:g}s")


def has_numbers(data: dict[str, Any]) -> bool:
    results = data["result"]
    values = [v for r in results for v in (r.get("values") or [r["value"]])]
    return any(math.isfinite(float(value)) for _, value in values)


Answers = dict[str, dict[str, bool]]  # panel title -> {refId: has data}


async def answer_panels(
    board: dict[str, Any], data: Path, window: dict[str, float], selections: list[Selection], scrape: float
) -> tuple[list[Answers], dict[str, list[str]]]:
    """Each panel's answers for each selection of the variables, and what each variable lists."""
    all_values = {v["name"]: v.get("allValue", "") for v in board["templating"]["list"] if v["type"] == "query"}
    server = prometheus.LocalPrometheus(data.parent)
    await server.start([], free_port())
    try:
        step = scrape
        every: list[Answers] = []
        for variables in selections:
            every.append(await _answers(server, board, window, variables, step, scrape, all_values))
        listed: dict[str, list[str]] = {}
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            metric, label = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["definition"]).groups()  # type: ignore[union-attr]
            match = interpolate(metric, selections[0], step, scrape, all_values)
            params = {"match[]": match, "start": f"{window['start']:.3f}", "end": f"{window['end']:.3f}"}
            listed[variable["name"]] = await server.api(f"label/{label}/values", params)
        return every, listed
    finally:
        await server.stop()


async def _answers(
    server: prometheus.LocalPrometheus,
    board: dict[str, Any],
    window: dict[str, float],
    variables: Selection,
    step: float,
    scrape: float,
    all_values: dict[str, str],
) -> Answers:
    answers: Answers = {}
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        answers[panel["title"]] = {}
        for target in panel["targets"]:
            span = window["end"] - window["start"]
            expr = interpolate(target["expr"], variables, step, scrape, all_values, span)
            if target.get("instant"):
                result = await server.api("query", {"query": expr, "time": f"{window['end']:.3f}"})
            else:
                params = {
                    "query": expr,
                    "start": f"{window['start']:.3f}",
                    "end": f"{window['end']:.3f}",
                    "step": f"{step:g}",
                }
                result = await server.api("query_range", params)
            answers[panel["title"]][target["refId"]] = has_numbers(result)
    return answers


def test_grafana_interpolation_of_a_multi_value_variable() -> None:
    variables: Selection = {"namespace": ["llm", "research.v2"], "npuinference": ["qwen-7b"]}
    expr = 'rate(m{namespace=~"$namespace", inference_npu_dev_name=~"$npuinference"}[$__rate_interval])'
    assert interpolate(expr, variables, step=15, scrape=15, all_values={}) == (
        'rate(m{namespace=~"(llm|research\\\\.v2)", inference_npu_dev_name=~"qwen-7b"}[60s])'
    )
    ranged = 'increase(m{namespace=~"$namespace"}[$__range])'
    assert interpolate(ranged, variables, 15, 15, {}, range_seconds=900.4) == (
        'increase(m{namespace=~"(llm|research\\\\.v2)"}[900s])'
    )
    everything: Selection = {"namespace": "All", "npuinference": ["qwen-7b"]}
    assert interpolate(expr, everything, step=30, scrape=15, all_values={"namespace": ".*"}) == (
        'rate(m{namespace=~".*", inference_npu_dev_name=~"qwen-7b"}[60s])'
    )
