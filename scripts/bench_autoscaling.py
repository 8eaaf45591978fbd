"""Autoscaling on paper: plan-derived targets against a queue-only target, on a bursty request trace.

A trace-driven simulation of one NPUInference. Replicas take the resource's startup time (weights
plus graph capture) to come up; each decodes its running requests in steps, in a captured graph up
to the largest captured batch and eagerly above it. Two autoscalers run on the same trace:

- plan: the operator's defaults. Per-replica target of running requests = targetUtilization (80%)
  x the largest captured batch x DP ranks; the same target for the queue; the endpoint picker never
  sends a replica more than the captured batch (llm-d's concurrency detector, maxConcurrency =
  batch, headroom 0), holding the rest in its flow-control queue.
- queue: what the anchors' guides do (KServe's and llm-d's KEDA examples scale on
  vllm:num_requests_waiting): a waiting-requests target per replica and a plain least-loaded
  router; each engine admits up to its max_num_seqs, so batches grow past the captured size before
  anything waits.

Both scale with the startup-derived behaviour the operator renders (at most double, or +1, per
startup; scale down after 2 x startup), so the comparison isolates the targets. A third row runs
the queue target with HPA's own defaults (double or +4 pods per 15 s, 300 s down window).

The workload: arrivals and lengths follow the published shape of the Azure LLM inference trace 2023
(Azure/AzurePublicDataset, AzureLLMInferenceDataset2023.md; Patel et al., "Splitwise", ISCA 2024):
the conversation trace holds 19,366 requests in about 58 minutes (its notebook), about 5.6 requests
per second, with a median prompt of about 1,020 tokens and a median output of about 129 tokens
(the Splitwise paper's characterization). Lengths are drawn lognormal around those medians; the
arrival rate is that mean scaled by --load and modulated by bursts (a two-state Markov process:
--burst times the rate for about two minutes, about every ten), as production LLM traffic is.

The device: decode steps of a 7B model on one Ascend 910B card, as an assumption of this script
(STEP_BASE_MS + STEP_PER_REQUEST_MS per request in a graph), and eager steps slower by
EAGER_FACTOR = 7.5, the slowdown vllm-ascend #16049 measured for decode batches above the largest
captured size. Prefill adds PREFILL_MS_PER_TOKEN per prompt token to the step that admits it.
Absolute figures are this model's; the ratios between the rows are the result.

`--pd` simulates a P/D resource instead (`simulate_pd`), as the operator scales its two roles apart:
the prefill role on the prompt tokens the router has at its engines (queued or being prefilled)
against 80% of a replica's step budget (max_num_batched_tokens x DP ranks), the decode role on its
running sequences against 80% of the largest captured batch x DP ranks, each with its own replica
count, startup and the same pace. The router sends a prompt to the prefill replica with the fewest
tokens outstanding and its decode to the decode replica with the fewest requests in flight, as
`npu-runtime route` does. The traffic ramps from --load up to --peak times it and back (a quarter
of the run at each: base, up, top, down). A prefill step takes PREFILL_STEP_BASE_MS plus
PREFILL_MS_PER_TOKEN per prompt token; the KV transfer's time is not modelled. It prints both
roles' replicas over time against their demand.

Run: .venv/bin/python scripts/bench_autoscaling.py   (about a minute; --minutes, --load, --seed; --pd)
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

# The published shape (see the docstring).
TRACE_REQUESTS_PER_SECOND = 19366 / (58.4 * 60)
MEDIAN_PROMPT_TOKENS = 1020
MEDIAN_OUTPUT_TOKENS = 129
LENGTH_SIGMA = 0.9  # this script's choice: the trace's long tail (lognormal spread)
# The device model (assumptions, see the docstring) and the cited eager slowdown.
STEP_BASE_MS = 25.0
STEP_PER_REQUEST_MS = 0.15
EAGER_FACTOR = 7.5  # vllm-ascend #16049
PREFILL_MS_PER_TOKEN = 0.04
PREFILL_STEP_BASE_MS = 20.0  # a prefill step's fixed cost (an assumption of this script)
TICK_S = 0.02
POLL_S = 15.0  # KEDA's pollingInterval
SCRAPE_S = 15.0  # Prometheus' scrape interval of the router (the PodMonitor's)
PREFILL_WINDOW_S = 60.0  # the prefill query's avg_over_time range (scaling.PREFILL_WINDOW)


@dataclasses.dataclass
class Request:
    arrival: float
    prompt: int
    remaining: int
    first_token: float | None = None


@dataclasses.dataclass
class Replica:
    ready_at: float
    running: list[Request] = dataclasses.field(default_factory=list)
    waiting: collections.deque[Request] = dataclasses.field(default_factory=collections.deque)
    busy_until: float = 0.0


@dataclasses.dataclass(frozen=True)
class Policy:
    name: str
    running_target: float | None  # per replica; None: not a trigger
    queue_target: float
    router_cap: int | None  # requests in flight per replica the router allows (None: no cap)
    up_period: float
    up_pods: int
    down_window: float


@dataclasses.dataclass
class Pace:
    """The HPA behaviour the operator renders, for one scale target: up at most double (or +up_pods)
    per up_period, counting what was added in that period as already there; down one replica a
    minute, only once every wish in the last down_window was below the current count."""

    up_period: float
    up_pods: int
    down_window: float
    scale_ups: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (time, replicas added)
    desired: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    def change(self, t: float, wanted: int, current: int) -> int:
        """Replicas to add (> 0), -1 when one idle replica may go (call `removed`), 0 otherwise."""
        self.desired.append((t, wanted))
        if wanted > current:
            added_recently = sum(n for when, n in self.scale_ups if when > t - self.up_period)
            base = current - added_recently
            allowed = max(base * 2, base + self.up_pods) - current  # Percent 100 or Pods, selectPolicy Max
            add = max(0, min(wanted - current, allowed))
            if add:
                self.scale_ups.append((t, add))
            return add
        if wanted < current:
            window_max = max(n for when, n in self.desired if when > t - self.down_window)
            # One a minute at most (the rendered Pods 1 / 60 s policy).
            if window_max < current and (not self.scale_ups or self.scale_ups[-1][0] < t - 60):
                return -1
        return 0

    def removed(self, t: float) -> None:
        self.scale_ups.append((t, 0))


@dataclasses.dataclass
class Result:
    eager_steps: int = 0
    steps: int = 0
    eager_tokens: int = 0
    tokens: int = 0
    ttfts: list[float] = dataclasses.field(default_factory=list)
    replica_seconds: float = 0.0
    peak_replicas: int = 0


def trace(minutes: float, load: float, burst: float, seed: int) -> list[Request]:
    rng = random.Random(seed)
    rate = TRACE_REQUESTS_PER_SECOND * load
    requests: list[Request] = []
    t, bursting, switch = 0.0, False, rng.expovariate(1 / 600)
    while t < minutes * 60:
        current = rate * (burst if bursting else 1.0)
        t += rng.expovariate(current)
        if t >= switch:
            bursting = not bursting
            switch = t + rng.expovariate(1 / (120 if bursting else 600))
        prompt = max(1, int(rng.lognormvariate(math.log(MEDIAN_PROMPT_TOKENS), LENGTH_SIGMA)))
        output = max(1, int(rng.lognormvariate(math.log(MEDIAN_OUTPUT_TOKENS), LENGTH_SIGMA)))
        requests.append(Request(t, prompt, output))
    return requests


def step_seconds(batch: int, captured: int, prefill_tokens: int) -> tuple[float, bool]:
    graph_ms = STEP_BASE_MS + STEP_PER_REQUEST_MS * batch
    eager = batch > captured
    decode_ms = graph_ms * EAGER_FACTOR if eager else graph_ms
    return (decode_ms + PREFILL_MS_PER_TOKEN * prefill_tokens) / 1000, eager


def simulate(
    requests: list[Request],
    policy: Policy,
    *,
    captured: int,
    max_num_seqs: int,
    startup: float,
    max_replicas: int,
) -> Result:
    result = Result()
    replicas = [Replica(ready_at=0.0)]
    held: collections.deque[Request] = collections.deque()  # the picker's flow-control queue
    pending = collections.deque(dataclasses.replace(r) for r in requests)
    end = requests[-1].arrival + 120 if requests else 0.0
    pace = Pace(policy.up_period, policy.up_pods, policy.down_window)
    next_poll, t = 0.0, 0.0

    def route(request: Request) -> bool:
        ready = [r for r in replicas if r.ready_at <= t]
        if not ready:
            return False
        target = min(ready, key=lambda r: len(r.running) + len(r.waiting))
        if policy.router_cap is not None and len(target.running) + len(target.waiting) >= policy.router_cap:
            return False
        target.waiting.append(request)
        return True

    while t < end or any(r.running or r.waiting for r in replicas) or held:
        while pending and pending[0].arrival <= t:
            request = pending.popleft()
            if held or not route(request):
                held.append(request)
        while held and route(held[0]):
            held.popleft()
        for replica in replicas:
            if replica.ready_at > t or replica.busy_until > t:
                continue
            prefill = 0
            while replica.waiting and len(replica.running) < max_num_seqs:
                admitted = replica.waiting.popleft()
                prefill += admitted.prompt
                replica.running.append(admitted)
            if not replica.running:
                continue
            seconds, eager = step_seconds(len(replica.running), captured, prefill)
            replica.busy_until = t + seconds
            result.steps += 1
            result.eager_steps += eager
            result.tokens += len(replica.running)
            result.eager_tokens += len(replica.running) if eager else 0
            for request in replica.running:
                if request.first_token is None:
                    request.first_token = replica.busy_until
                    result.ttfts.append(request.first_token - request.arrival)
                request.remaining -= 1
            replica.running = [r for r in replica.running if r.remaining > 0]
        if t >= next_poll:
            next_poll = t + POLL_S
            running = sum(len(r.running) for r in replicas)
            waiting = sum(len(r.waiting) for r in replicas) + len(held)
            wanted = math.ceil(waiting / policy.queue_target)
            if policy.running_target is not None:
                wanted = max(wanted, math.ceil(running / policy.running_target))
            wanted = min(max(wanted, 1), max_replicas)
            change = pace.change(t, wanted, len(replicas))
            replicas += [Replica(ready_at=t + startup) for _ in range(max(change, 0))]
            idle = [r for r in replicas if not r.running and not r.waiting]
            if change < 0 and idle:
                replicas.remove(idle[-1])
                pace.removed(t)
        result.replica_seconds += len(replicas) * TICK_S
        result.peak_replicas = max(result.peak_replicas, len(replicas))
        t += TICK_S
    return result


# --- P/D -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PrefillReplica:
    ready_at: float
    queue: collections.deque[Request] = dataclasses.field(default_factory=collections.deque)
    busy_until: float = 0.0
    batch: list[Request] = dataclasses.field(default_factory=list)  # being prefilled until busy_until

    @property
    def tokens(self) -> int:
        """What the router counts for this engine: the prompts sent to it and not yet answered."""
        return sum(r.prompt for r in self.queue) + sum(r.prompt for r in self.batch)


@dataclasses.dataclass(frozen=True)
class PDShape:
    """The two roles, as the plan gives them."""

    captured: int  # decode: largest captured batch per DP rank
    max_num_seqs: int
    decode_dp: int
    batched_tokens: int  # prefill: max_num_batched_tokens per DP rank
    prefill_dp: int
    startup: float
    max_replicas: int
    utilization: int = 80

    @property
    def decode_target(self) -> int:
        return max(1, self.captured * self.decode_dp * self.utilization // 100)

    @property
    def prefill_target(self) -> int:
        return max(1, self.batched_tokens * self.prefill_dp * self.utilization // 100)


def ramp(minutes: float, base: float, peak: float) -> Callable[[float], float]:
    """The arrival rate at time t: base for a quarter of the run, up to peak x base, held, back down."""
    quarter = minutes * 60 / 4

    def rate(t: float) -> float:
        if t < quarter:
            return base
        if t < 2 * quarter:
            return base * (1 + (peak - 1) * (t - quarter) / quarter)
        if t < 3 * quarter:
            return base * peak
        return base * (1 + (peak - 1) * max(0.0, 4 * quarter - t) / quarter)

    return rate


def ramp_trace(minutes: float, rate: Callable[[float], float], seed: int) -> list[Request]:
    """Poisson arrivals at `rate(t)` (thinning), the trace's lengths."""
    rng = random.Random(seed)
    top = max(rate(i * 1.0) for i in range(int(minutes * 60) + 1))
    requests: list[Request] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= minutes * 60:
            return requests
        if rng.random() * top > rate(t):
            continue
        prompt = max(1, int(rng.lognormvariate(math.log(MEDIAN_PROMPT_TOKENS), LENGTH_SIGMA)))
        output = max(1, int(rng.lognormvariate(math.log(MEDIAN_OUTPUT_TOKENS), LENGTH_SIGMA)))
        requests.append(Request(t, prompt, output))


def simulate_pd(
    requests: list[Request], shape: PDShape, report_every: float, up_pods: int = 1
) -> tuple[Result, list[dict[str, float]]]:
    """One P/D resource, its roles scaled apart (see the docstring); the result and one row per
    `report_every` seconds: demand, what the autoscalers asked for, what is ready."""
    result = Result()
    prefill = [PrefillReplica(ready_at=0.0)]
    decode = [Replica(ready_at=0.0)]
    paces = {role: Pace(shape.startup, up_pods, 2 * shape.startup) for role in ("prefill", "decode")}
    wanted = {"prefill": 1, "decode": 1}
    pending = collections.deque(dataclasses.replace(r) for r in requests)
    end = requests[-1].arrival + 120 if requests else 0.0
    rows: list[dict[str, float]] = []
    arrived_tokens = arrived = 0
    next_poll = next_report = next_scrape = t = 0.0
    scraped: collections.deque[tuple[float, int]] = collections.deque(maxlen=16)
    step_budget = shape.batched_tokens * shape.prefill_dp
    decode_cap = shape.max_num_seqs * shape.decode_dp
    captured = shape.captured * shape.decode_dp

    def least(replicas: list[Any], load: Callable[[Any], int]) -> Any:
        ready = [r for r in replicas if r.ready_at <= t]
        return min(ready, key=load) if ready else None

    held: dict[str, collections.deque[Request]] = {"prefill": collections.deque(), "decode": collections.deque()}

    def busy() -> bool:
        return bool(
            held["prefill"]
            or held["decode"]
            or any(r.queue or r.batch for r in prefill)
            or any(r.running or r.waiting for r in decode)
        )

    while t < end or pending or busy():
        while pending and pending[0].arrival <= t:
            request = pending.popleft()
            arrived += 1
            arrived_tokens += request.prompt
            held["prefill"].append(request)
        # The router: a prompt to the prefill engine with the fewest tokens outstanding, a decode to the one
        # with the fewest requests in flight; held while a role has no ready replica.
        while held["prefill"] and (to := least(prefill, lambda r: r.tokens)) is not None:
            to.queue.append(held["prefill"].popleft())
        while held["decode"] and (to := least(decode, lambda r: len(r.running) + len(r.waiting))) is not None:
            to.waiting.append(held["decode"].popleft())
        for replica in prefill:
            if replica.ready_at > t or replica.busy_until > t:
                continue
            for done in replica.batch:  # prefilled: the first token, then decode with its KV
                done.first_token = t
                result.ttfts.append(t - done.arrival)
                done.remaining -= 1
                if done.remaining > 0:
                    held["decode"].append(done)
            replica.batch = []
            tokens = 0
            while replica.queue and (tokens + replica.queue[0].prompt <= step_budget or not tokens):
                admitted = replica.queue.popleft()
                tokens += admitted.prompt
                replica.batch.append(admitted)
            if replica.batch:
                # Chunked over steps of the budget: a prompt above it takes several.
                steps = max(1, math.ceil(tokens / step_budget))
                replica.busy_until = t + (steps * PREFILL_STEP_BASE_MS + PREFILL_MS_PER_TOKEN * tokens) / 1000
        for engine in decode:
            if engine.ready_at > t or engine.busy_until > t:
                continue
            while engine.waiting and len(engine.running) < decode_cap:
                engine.running.append(engine.waiting.popleft())
            if not engine.running:
                continue
            seconds, eager = step_seconds(len(engine.running), captured, 0)
            engine.busy_until = t + seconds
            result.steps += 1
            result.eager_steps += eager
            result.tokens += len(engine.running)
            result.eager_tokens += len(engine.running) if eager else 0
            for request in engine.running:
                request.remaining -= 1
            engine.running = [r for r in engine.running if r.remaining > 0]
        queued_tokens = sum(r.tokens for r in prefill) + sum(r.prompt for r in held["prefill"])
        running = sum(len(r.running) for r in decode)
        waiting = sum(len(r.waiting) for r in decode) + len(held["decode"])
        if t >= next_scrape:  # Prometheus scrapes the router's gauge
            next_scrape = t + SCRAPE_S
            scraped.append((t, queued_tokens))
        if t >= next_poll:
            next_poll = t + POLL_S
            # The prefill query averages a minute of scrapes (avg_over_time [1m]): one long prompt is a spike.
            window = [tokens for when, tokens in scraped if when > t - PREFILL_WINDOW_S]
            signals = {
                "prefill": math.ceil(sum(window) / max(len(window), 1) / shape.prefill_target),
                "decode": max(math.ceil(running / shape.decode_target), math.ceil(waiting / shape.decode_target)),
            }
            wanted = {role: min(max(signal, 1), shape.max_replicas) for role, signal in signals.items()}
            change = paces["prefill"].change(t, wanted["prefill"], len(prefill))
            prefill += [PrefillReplica(ready_at=t + shape.startup) for _ in range(max(change, 0))]
            idle_prefill = [r for r in prefill if not (r.queue or r.batch)]
            if change < 0 and idle_prefill:
                prefill.remove(idle_prefill[-1])
                paces["prefill"].removed(t)
            change = paces["decode"].change(t, wanted["decode"], len(decode))
            decode += [Replica(ready_at=t + shape.startup) for _ in range(max(change, 0))]
            idle_decode = [r for r in decode if not (r.running or r.waiting)]
            if change < 0 and idle_decode:
                decode.remove(idle_decode[-1])
                paces["decode"].removed(t)
        if t >= next_report:
            span = report_every if t else 1.0
            rows.append(
                {
                    "minute": t / 60,
                    "requests_per_s": arrived / span,
                    "prompt_tokens_per_s": arrived_tokens / span,
                    "prefill_queued_tokens": queued_tokens,
                    "prefill_wanted": wanted["prefill"],
                    "prefill_replicas": len(prefill),
                    "prefill_ready": sum(r.ready_at <= t for r in prefill),
                    "decode_running": running,
                    "decode_wanted": wanted["decode"],
                    "decode_replicas": len(decode),
                    "decode_ready": sum(r.ready_at <= t for r in decode),
                }
            )
            arrived = arrived_tokens = 0
            next_report = t + report_every
        result.replica_seconds += (len(prefill) + len(decode)) * TICK_S
        result.peak_replicas = max(result.peak_replicas, len(prefill) + len(decode))
        t += TICK_S
    return result, rows


def print_pd(args: argparse.Namespace) -> None:
    shape = PDShape(
        captured=args.captured,
        # The operator's plan captures up to the engine's maxNumSeqs: a decode engine never batches above
        # its largest graph; what exceeds it waits in the engine's queue (the decode trigger's waiting requests).
        max_num_seqs=args.captured,
        decode_dp=1,
        batched_tokens=args.batched_tokens,
        prefill_dp=1,
        startup=args.startup,
        max_replicas=args.max_replicas,
    )
    rate = ramp(args.minutes, TRACE_REQUESTS_PER_SECOND * args.load, args.peak)
    requests = ramp_trace(args.minutes, rate, args.seed)
    prefill_capacity = (
        shape.batched_tokens
        * shape.prefill_dp
        / ((PREFILL_STEP_BASE_MS + PREFILL_MS_PER_TOKEN * shape.batched_tokens) / 1000)
    )
    print(
        f"P/D: {len(requests)} requests in {args.minutes:g} min, ramp x{args.load:g} -> x{args.load * args.peak:g} "
        f"the trace's mean rate; prompt/output medians {MEDIAN_PROMPT_TOKENS}/{MEDIAN_OUTPUT_TOKENS} tokens"
    )
    print(
        f"prefill replica: {shape.batched_tokens} batched tokens per step, at most {prefill_capacity:,.0f} prompt "
        f"tokens/s; target {shape.prefill_target} queued tokens/replica. decode replica: largest captured batch "
        f"{shape.captured}, target {shape.decode_target} running/replica. startup {shape.startup:g} s each."
    )
    result, rows = simulate_pd(requests, shape, args.report_seconds)
    print()
    print(
        "| min | req/s | prompt tok/s | prefill queued tok | prefill wanted / replicas (ready) "
        "| decode running | decode wanted / replicas (ready) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['minute']:4.0f} | {row['requests_per_s']:5.1f} | {row['prompt_tokens_per_s']:8,.0f} "
            f"| {row['prefill_queued_tokens']:9,.0f} | {row['prefill_wanted']:.0f} / {row['prefill_replicas']:.0f} "
            f"({row['prefill_ready']:.0f}) | {row['decode_running']:5.0f} | {row['decode_wanted']:.0f} / "
            f"{row['decode_replicas']:.0f} ({row['decode_ready']:.0f}) |"
        )
    print()
    print(
        f"TTFT p50 {percentile(result.ttfts, 0.5):.2f} s, p95 {percentile(result.ttfts, 0.95):.2f} s; "
        f"decode steps eager {result.eager_steps / max(result.steps, 1):.1%}; "
        f"replica-hours {result.replica_seconds / 3600:.2f} (both roles), peak {result.peak_replicas}"
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=40)
    parser.add_argument("--load", type=float, default=1.0, help="times the trace's mean rate")
    parser.add_argument("--burst", type=float, default=3.0, help="rate multiplier during a burst")
    parser.add_argument("--captured", type=int, default=64, help="largest captured decode batch")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--startup", type=float, default=300, help="replica startup (load + capture), s")
    parser.add_argument("--max-replicas", type=int, default=16)
    parser.add_argument("--queue-target", type=float, default=10, help="waiting requests per replica (queue row)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pd", action="store_true", help="simulate a P/D resource under a traffic ramp instead")
    parser.add_argument("--peak", type=float, default=4.0, help="--pd: the ramp's top, times --load")
    parser.add_argument("--batched-tokens", type=int, default=8192, help="--pd: prefill max_num_batched_tokens")
    parser.add_argument("--report-seconds", type=float, default=120, help="--pd: one row per this many seconds")
    args = parser.parse_args()
    if args.pd:
        print_pd(args)
        return

    requests = trace(args.minutes, args.load, args.burst, args.seed)
    plan_target = max(1, args.captured * 80 // 100)
    policies = [
        Policy("plan targets (operator)", plan_target, plan_target, args.captured, args.startup, 1, 2 * args.startup),
        Policy("queue only, same pace", None, args.queue_target, None, args.startup, 1, 2 * args.startup),
        Policy("queue only, HPA defaults", None, args.queue_target, None, 15, 4, 300),
    ]
    print(
        f"trace: {len(requests)} requests in {args.minutes:g} min ({len(requests) / args.minutes / 60:.1f}/s, "
        f"bursts x{args.burst:g}); prompt/output medians {MEDIAN_PROMPT_TOKENS}/{MEDIAN_OUTPUT_TOKENS} tokens"
    )
    print(
        f"replica: largest captured batch {args.captured}, max_num_seqs {args.max_num_seqs}, startup "
        f"{args.startup:g} s, eager x{EAGER_FACTOR:g}; plan target {plan_target} running/replica, "
        f"queue target {args.queue_target:g} waiting/replica"
    )
    rows: list[tuple[str, Result]] = []
    run: Callable[[Policy], Result] = lambda policy: simulate(  # noqa: E731
        requests,
        policy,
        captured=args.captured,
        max_num_seqs=args.max_num_seqs,
        startup=args.startup,
        max_replicas=args.max_replicas,
    )
    for policy in policies:
        rows.append((policy.name, run(policy)))
    print()
    print(
        f"| {'autoscaler':26} | eager decode steps | tokens decoded eagerly | p95 TTFT (s) | p50 TTFT (s) "
        "| replica-hours | peak replicas |"
    )
    print(f"| {'-' * 26} | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, result in rows:
        share = result.eager_steps / max(result.steps, 1)
        tokens = result.eager_tokens / max(result.tokens, 1)
        print(
            f"| {name:26} | {share:6.1%} | {tokens:6.1%} | {percentile(result.ttfts, 0.95):8.1f} | "
            f"{percentile(result.ttfts, 0.5):8.2f} | {result.replica_seconds / 3600:6.2f} | {result.peak_replicas} |"
        )
    plan, queue = rows[0][1], rows[1][1]
    print()
    print(
        f"plan vs queue-only (same pace): p95 TTFT x{percentile(queue.ttfts, 0.95) / percentile(plan.ttfts, 0.95):.1f} "
        f"lower, replica-hours x{plan.replica_seconds / queue.replica_seconds:.2f}"
    )


if __name__ == "__main__":
    main()
