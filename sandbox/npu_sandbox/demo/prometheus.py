"""A real Prometheus for the sandbox: scrapes the operator and the pods, evaluates the chart's alerts.

What a cluster's prometheus-operator would set up from the chart's PodMonitors, written by hand:
one scrape job whose targets come from a file (file_sd; rewritten when a pod starts), each target
with the labels the PodMonitors give (`namespace`, `pod`, `container`, `endpoint`, `job` and
`inference_npu_dev_name` copied from the pod label inference.npu.dev/name; `group` and
`node_rank` from a LeaderWorkerSet pod's group and worker index, as the endpoints' relabelings
do: `builders.RANK_TARGET_LABELS`), and the chart's
PrometheusRule groups, rendered by the real helm, as the rule file. Prometheus listens on
127.0.0.1 and scrapes each pod at its own address; the TSDB lies in the workdir, so a later
Prometheus can open it again (the dashboard test does).

The binary is Debian's `prometheus` package (scripts/bootstrap installs it as root on Debian).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml
from npu_operator.kube import names as builders

from npu_sandbox.demo.helm import HelmFailed, helm_binary
from npu_sandbox.demo.repository import CHART
from npu_sandbox.node.process import die_with_parent

SCRAPE_INTERVAL_SECONDS: Final = 1
POD_MONITOR_JOB: Final = "npu-system/npu-inference-operator-inference"
OPERATOR_JOB: Final = "npu-system/npu-inference-operator"


class PrometheusUnavailable(Exception):
    """No prometheus binary, or it did not start; the message says which and what to do."""


def binary() -> str | None:
    return shutil.which("prometheus")


def rules_file(groups: Sequence[Mapping[str, Any]]) -> str:
    """A Prometheus rule file with a PrometheusRule's groups, multi-line expressions as blocks."""

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml.dump({"groups": [dict(group) for group in groups]}, Dumper=Dumper, sort_keys=False, width=1000)


def chart_rule_groups() -> list[dict[str, Any]]:
    """The chart's PrometheusRule groups with its default values, rendered by `helm template`."""
    try:
        helm = helm_binary()
    except HelmFailed as exc:
        raise PrometheusUnavailable(str(exc)) from exc
    result = subprocess.run(
        [
            helm,
            "template",
            "npu",
            str(CHART),
            "--namespace",
            "npu-system",
            "--set",
            "monitoring.prometheusRule.enabled=true",
            "--show-only",
            "templates/prometheusrule.yaml",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise PrometheusUnavailable(f"helm template failed: {result.stderr.strip()}")
    groups: list[dict[str, Any]] = yaml.safe_load(result.stdout)["spec"]["groups"]
    return groups


def config(rule_file: Path, targets_dir: Path) -> dict[str, Any]:
    interval = f"{SCRAPE_INTERVAL_SECONDS}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(rule_file)],
        "scrape_configs": [
            {
                "job_name": "sandbox",
                "file_sd_configs": [{"files": [str(targets_dir / "*.json")], "refresh_interval": interval}],
            }
        ],
    }


class LocalPrometheus:
    """One Prometheus process on 127.0.0.1 with its TSDB, config and targets under `workdir`."""

    def __init__(self, workdir: Path, *, executable: str | None = None) -> None:
        self.workdir = workdir
        self.data = workdir / "data"
        self.targets = workdir / "targets"
        self.log_path = workdir / "prometheus.log"
        self.executable = executable or binary()
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, rule_groups: Sequence[Mapping[str, Any]], port: int, within: float = 60.0) -> None:
        if self.executable is None:
            raise PrometheusUnavailable(
                "prometheus not found: install Debian's prometheus package "
                "(apt-get install --no-install-recommends prometheus; scripts/bootstrap does it as root)"
            )
        self.targets.mkdir(parents=True, exist_ok=True)
        rule_file = self.workdir / "rules.yaml"
        rule_file.write_text(rules_file(rule_groups), encoding="utf-8")
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config(rule_file, self.targets), sort_keys=False), encoding="utf-8")
        self.port = port
        with self.log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                self.executable,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=30d",
                "--log.level=warn",
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        await self._wait_ready(within)

    async def _wait_ready(self, within: float) -> None:
        deadline = time.monotonic() + within
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with session.get(f"{self.url}/-/ready") as response:
                        if response.status == 200:
                            return
                if self.process is None or self.process.returncode is not None or time.monotonic() > deadline:
                    tail = self.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
                    await self.stop()
                    raise PrometheusUnavailable(f"prometheus did not become ready; {self.log_path}:\n{tail}")
                await asyncio.sleep(0.2)

    def set_targets(self, name: str, groups: Sequence[tuple[Sequence[str], Mapping[str, str]]]) -> None:
        """Scrape `groups` of (addresses, labels); Prometheus picks the file up within a second."""
        document = [{"targets": list(addresses), "labels": dict(labels)} for addresses, labels in groups]
        path = self.targets / f"{name}.json"
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps(document, indent=2), encoding="utf-8")
        os.replace(partial, path)

    async def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer, else an exception with the error."""
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.get(f"{self.url}/api/v1/{path}", params=params) as response,
        ):
            document = await response.json(content_type=None)
        if document.get("status") != "success":
            raise RuntimeError(f"prometheus /api/v1/{path} {dict(params or {})}: {document.get('error')}")
        return document["data"]

    async def active_targets(self) -> list[dict[str, Any]]:
        """The active targets as the API gives them (labels, health, lastScrape, lastError, ...)."""
        active: list[dict[str, Any]] = (await self.api("targets", {"state": "active"}))["activeTargets"]
        return active

    async def wait_for_scrapes_after(self, moment: float, within: float = 30.0) -> None:
        """Until every target has been scraped successfully after `moment` (unix time) and the rules ran
        again; PrometheusUnavailable naming the targets not scraped, and why, if that takes over `within`."""
        deadline = time.monotonic() + within
        while True:
            active = await self.active_targets()
            behind = [t for t in active if _unix(t["lastScrape"]) <= moment or t["health"] != "up"]
            if active and not behind:
                await asyncio.sleep(2 * SCRAPE_INTERVAL_SECONDS)  # one more rule evaluation
                return
            if time.monotonic() >= deadline:
                raise PrometheusUnavailable(
                    f"no successful scrape of every target within {within:g}s: "
                    + ("; ".join(describe_target(t) for t in behind) or "no active target")
                    + f" (log {self.log_path})"
                )
            await asyncio.sleep(0.5)

    async def stop(self, grace: float = 10.0) -> int | None:
        process, self.process = self.process, None
        if process is None:
            return None
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                process.kill()
                await process.wait()
        return process.returncode


def _unix(rfc3339: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def describe_target(target: Mapping[str, Any]) -> str:
    """One target's state in a line: its URL, health, last scrape's duration and error."""
    error = target.get("lastError") or "no error"
    duration = float(target.get("lastScrapeDuration") or 0.0)
    return f"{target['scrapeUrl']} {target['health']} (last scrape {duration:.1f}s, {error})"


def pod_targets(pod: Mapping[str, Any]) -> list[tuple[list[str], dict[str, str]]]:
    """What the chart's inference PodMonitor makes of a pod: one target per endpoint (the pod's IP and
    the container port of that name, as the Pod object says), its labels."""
    metadata = pod["metadata"]
    address = pod.get("status", {}).get("podIP")
    ports = {
        p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if "name" in p
    }
    common = {
        "job": POD_MONITOR_JOB,
        "namespace": metadata["namespace"],
        "pod": metadata["name"],
        "container": "runtime",
        "inference_npu_dev_name": metadata.get("labels", {}).get("inference.npu.dev/name", ""),
    }
    labels = metadata.get("labels", {})
    common |= {target: labels[label] for target, label in builders.RANK_TARGET_LABELS.items() if labels.get(label)}
    return [([f"{address}:{ports[endpoint]}"], {**common, "endpoint": endpoint}) for endpoint in ("metrics", "http")]


def operator_targets(address: str, port: int) -> list[tuple[list[str], dict[str, str]]]:
    """The operator's pod (the chart's Deployment, run by the sandbox's kubelet), labelled as its PodMonitor would."""
    labels = {
        "job": OPERATOR_JOB,
        "namespace": "npu-system",
        "pod": "npu-operator-sandbox",
        "container": "operator",
        "endpoint": "metrics",
    }
    return [([f"{address}:{port}"], labels)]


async def report(prometheus: LocalPrometheus, since: float) -> dict[str, Any]:
    """The npu_graph_* series scraped since `since` (unix time) and the alerts pending or firing."""
    series = await prometheus.api("series", {"match[]": '{__name__=~"npu_graph_.*"}', "start": f"{since:.3f}"})
    alerts = (await prometheus.api("alerts"))["alerts"]
    return {
        "url": prometheus.url,
        "data": str(prometheus.data),
        "scrape_interval_seconds": SCRAPE_INTERVAL_SECONDS,
        "series": sorted(_series_text(s) for s in series),
        "metrics": sorted({s["__name__"] for s in series}),
        "alerts": [
            {"name": a["labels"]["alertname"], "state": a["state"], "labels": a["labels"], "summary": _summary(a)}
            for a in sorted(alerts, key=lambda a: (a["labels"]["alertname"], a["state"]))
        ],
    }


def _series_text(labels: Mapping[str, str]) -> str:
    name = labels["__name__"]
    rest = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()) if key != "__name__")
    return f"{name}{{{rest}}}"


def _summary(alert: Mapping[str, Any]) -> str:
    return str(alert.get("annotations", {}).get("summary", ""))
