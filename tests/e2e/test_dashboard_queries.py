"""Every Grafana panel's queries answered by a real Prometheus holding what the sandbox scraped.

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

import asyncio
import importlib.util
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from npu_sandbox.demo import prometheus
from npu_sandbox.node.network import free_port

from tests.e2e.conftest import SandboxRun

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


@pytest.mark.engine
def test_every_dashboard_panel_answers_from_the_sandboxs_prometheus(sandbox_run: SandboxRun, tmp_path: Path) -> None:
    if prometheus.binary() is None:
        pytest.skip("prometheus not found: install Debian's prometheus package (scripts/bootstrap does it as root)")
    found = sandbox_run.summary["prometheus"]
    data = tmp_path / "prometheus" / "data"
    shutil.copytree(found["data"], data)  # the sandbox's own copy stays as it was
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    chosen: Selection = {"namespace": ["default"], "npuinference": ["tiny-llama"]}
    everything: Selection = {"namespace": "All", "npuinference": "All"}  # the dashboard's default

    (answers, answers_for_all), listed = asyncio.run(
        answer_panels(board, data, found["window"], [chosen, everything], float(found["scrape_interval_seconds"]))
    )

    npu_only = generator().NPU_ONLY
    # The sandbox runs neither KEDA nor kube-state-metrics: the autoscaling panels stay empty too.
    keda_only = generator().KEDA_ONLY
    empty_here = npu_only | keda_only
    report = "\n".join(
        f"{title:58} {'data' if any(refs.values()) else 'no data':8} "
        f"{'NPU only' if title in npu_only else 'KEDA only' if title in keda_only else ''}"
        for title, refs in answers.items()
    )
    print("\n" + report)
    assert listed["namespace"] == ["default"] and listed["npuinference"] == ["tiny-llama"], listed
    assert npu_only <= answers.keys(), npu_only - answers.keys()
    for title, refs in answers.items():
        if title in empty_here:
            assert not any(refs.values()), f"{title}: data here, yet listed as NPU or KEDA only\n{report}"
        else:
            assert all(refs.values()), f"{title}: no data for query {refs} on CPU\n{report}"
    assert answers_for_all == answers, "with All selected, the panels should answer as for the one resource"


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
