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

Run: .venv/bin/python scripts/bench_autoscaling.py   (about a minute; --minutes, --load, --seed)
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import random
from collections.abc import Callable

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
TICK_S = 0.02
POLL_S = 15.0  # KEDA's pollingInterval


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
    scale_ups: list[tuple[float, int]] = []  # (time, replicas added)
    desired_history: list[tuple[float, int]] = []
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
            desired_history.append((t, wanted))
            current = len(replicas)
            if wanted > current:
                added_recently = sum(n for when, n in scale_ups if when > t - policy.up_period)
                base = current - added_recently
                allowed = max(base * 2, base + policy.up_pods) - current  # Percent 100 or Pods, selectPolicy Max
                add = max(0, min(wanted - current, allowed))
                if add:
                    scale_ups.append((t, add))
                    replicas += [Replica(ready_at=t + startup) for _ in range(add)]
            elif wanted < current:
                window_max = max(n for when, n in desired_history if when > t - policy.down_window)
                if window_max < current:
                    idle = [r for r in replicas if not r.running and not r.waiting]
                    # One a minute at most (the rendered Pods 1 / 60 s policy), and an idle one.
                    if idle and (not scale_ups or scale_ups[-1][0] < t - 60):
                        replicas.remove(idle[-1])
                        scale_ups.append((t, 0))
        result.replica_seconds += len(replicas) * TICK_S
        result.peak_replicas = max(result.peak_replicas, len(replicas))
        t += TICK_S
    return result


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
    args = parser.parse_args()

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
