"""The capture sizes a plan offers to fitting, and the decode batches the fitted sizes leave eager.

Before fitting: the sizes that cover every decode batch up to max_num_seqs (`sizes.covering_sizes`)
with our additions, the explicit list when one is given, what the engine release keeps of them
(`releases.engine_capture_sizes`) and the max_num_batched_tokens the plan pins. From the options
alone, for the operator: `largest_decode_batch` and `batched_token_budget`.
"""

from __future__ import annotations

from npu_runtime.contract import PlanError, PlanOptions
from npu_runtime.planner import modes, releases, sizes

__all__ = [
    "batched_token_budget",
    "batched_tokens_for",
    "candidate_sizes",
    "eager_decode_batches",
    "engine_kept",
    "largest_decode_batch",
]


def largest_decode_batch(options: PlanOptions) -> int:
    """The largest decode batch, in requests, that a plan for `options` runs in a captured graph.

    It depends on the spec alone, never on the device or the model: every plan keeps its ceiling
    when it thins the candidates (`sizes.thin` keeps the largest size, `fit._choose_sizes`), and a
    decode step of n requests is a batch of n x (1 + speculative tokens) tokens. What the engine
    release keeps of the candidates (`engine_kept`: flashcomm1 given in the options) is applied
    as make_plan applies it. 0 for graph mode NONE. A planner downgrade on the device (to NONE, or
    a capture that failed) is the pods' to report (status.graph). Raises PlanError for options
    make_plan would refuse the same way.
    """
    if options.graph_mode == modes.NONE or options.enforce_eager:
        return 0
    q = 1 + options.speculative_tokens
    flashcomm1 = bool(options.flashcomm1)
    ceiling, candidates = candidate_sizes(options, options.graph_mode, q, [], flashcomm1)
    rules = releases.select(options.engine_release)
    kept = engine_kept(
        rules, options, options.graph_mode, candidates, batched_tokens_for(options, ceiling), flashcomm1, []
    )
    return min(max(kept) // q, options.max_num_seqs)


def batched_token_budget(options: PlanOptions) -> int:
    """max_num_batched_tokens of a plan for `options`: the prompt tokens one engine (DP rank) takes
    into one step. Like `largest_decode_batch`, from the options alone (the requested mode's
    ceiling, flashcomm1 as given in the options; `batched_tokens_for` does not depend on the device).
    Raises PlanError as make_plan would."""
    q = 1 + options.speculative_tokens
    ceiling, _ = candidate_sizes(options, options.graph_mode, q, [], bool(options.flashcomm1))
    return batched_tokens_for(options, ceiling)


def candidate_sizes(
    options: PlanOptions, mode: str, q: int, warnings: list[str], flashcomm1: bool = False
) -> tuple[int, tuple[int, ...]]:
    """(ceiling, the sizes before fitting). The ceiling is the largest decode batch in tokens.

    Our own additions to vLLM's grid, passed to the engine as an explicit list so that it captures
    them too: the off-grid ceiling max_num_seqs x (1 + k) (vllm-ascend's default leaves it out,
    #16049); under flashcomm1 with TP > 1 and a mixed graph mode, the ceiling rounded up to a
    multiple of TP, since the engine keeps only multiples of TP (FULL_DECODE_ONLY keeps no size
    above max_num_seqs x (1 + k): there the largest multiple below it, and the batches above it
    run eagerly).
    """
    full_decode = modes.decode_mode(mode) == modes.FULL
    decode_ceiling = options.max_num_seqs * q
    tp = options.tensor_parallel
    if flashcomm1 and tp > 1 and mode != modes.FULL_DECODE_ONLY and options.max_capture_size is None:
        multiple = max(q, tp) if full_decode else tp
        decode_ceiling = -(-decode_ceiling // multiple) * multiple
    ceiling = options.max_capture_size if options.max_capture_size is not None else decode_ceiling
    if full_decode and q > 1 and ceiling % q:
        raise PlanError(
            "max_capture_size",
            f"{ceiling} is not a multiple of 1 + speculative tokens = {q}; FULL decode graphs need whole requests",
        )
    if options.capture_sizes is not None:
        explicit = tuple(options.capture_sizes)
        problem = sizes.validate_sizes(explicit, ceiling, q if full_decode else 1)
        if problem:
            raise PlanError("capture_sizes", problem)
        if options.max_capture_size is not None and explicit[-1] != options.max_capture_size:
            # vllm/config/vllm.py _set_cudagraph_sizes raises when both are given and disagree.
            raise PlanError(
                "max_capture_size",
                f"{options.max_capture_size} differs from the largest capture size {explicit[-1]}; vLLM refuses that",
            )
        return explicit[-1], explicit
    if ceiling < options.max_num_seqs * q:
        warnings.append(
            f"max capture size {ceiling} is below max_num_seqs x (1 + speculative tokens) = {options.max_num_seqs * q}"
        )
    covering = sizes.covering_sizes(options.max_num_seqs, q, ceiling)
    if flashcomm1 and tp > 1 and mode == modes.FULL_DECODE_ONLY:
        # The engine keeps no size above max_num_seqs x (1 + k) here: the largest multiple it keeps
        # below the ceiling covers the most batches a graph can.
        multiple = max(q, tp) if full_decode else tp
        below = ceiling // multiple * multiple
        covering = tuple(sorted({*covering, below})) if below else covering
    return ceiling, covering


def batched_tokens_for(options: PlanOptions, ceiling: int) -> int:
    """max_num_batched_tokens the plan pins (and budgets the activation for).

    At least vLLM's smallest default for the OpenAI server (sizes.ENGINE_MIN_BATCHED_TOKENS); it must
    be at least max_num_seqs (SchedulerConfig) and at least the largest capture size, or vLLM drops
    that size (_set_cudagraph_sizes keeps sizes <= max_num_batched_tokens). The value does not
    depend on device memory, so more memory never changes the activation budget. A value given
    (--max-num-batched-tokens, as vllm-ascend's tutorials set it) is kept when it meets those bounds.
    """
    needed = max(ceiling, options.max_num_seqs * (1 + options.speculative_tokens))
    given = options.max_num_batched_tokens
    if given is not None:
        if given < 1:
            raise PlanError("max_num_batched_tokens", f"must be a positive integer, got {given}")
        if given < needed:
            raise PlanError(
                "max_num_batched_tokens",
                f"{given} is below the largest decode batch of {needed} tokens (max_num_seqs x (1 + speculative "
                "tokens), or the largest capture size); vLLM would drop the capture sizes above it",
            )
        return given
    return max(sizes.ENGINE_MIN_BATCHED_TOKENS, needed)


def engine_kept(
    rules: releases.ReleaseRules,
    options: PlanOptions,
    mode: str,
    candidates: tuple[int, ...],
    batched_tokens: int,
    flashcomm1: bool,
    warnings: list[str],
) -> tuple[int, ...]:
    """The candidates the engine keeps: the release's algorithm run on the plan's explicit list
    (`releases.engine_capture_sizes`), so that the plan lists only sizes the engine captures; each
    size it drops is named with the step and the source that drop it."""
    if mode == modes.NONE or not candidates:
        return candidates
    steps = releases.engine_capture_sizes(
        rules,
        explicit=candidates,
        mode=mode,
        max_num_seqs=options.max_num_seqs,
        decode_query_len=1 + options.speculative_tokens,
        max_num_batched_tokens=batched_tokens,
        tensor_parallel=options.tensor_parallel,
        flashcomm1=flashcomm1,
    )
    for step in steps:
        if step.removed:
            warnings.append(
                f"capture sizes {list(step.removed)} left out: vllm-ascend {rules.release} drops them at its "
                f"{step.step} step ({step.source})"
            )
    kept = steps[-1].sizes
    if not kept:
        raise PlanError("capture_sizes", f"vllm-ascend {rules.release} keeps none of {list(candidates)}")
    return kept


def eager_decode_batches(
    mode: str, chosen: tuple[int, ...], max_num_seqs: int, q: int, warnings: list[str]
) -> tuple[int, int] | None:
    """Decode batches (first, last, in requests) above the largest captured size, though graphs are on."""
    if not modes.decode_mode_is_graph(mode):
        return None
    missed = sizes.uncovered(chosen, max_num_seqs, q)
    if not missed:
        return None
    eager = (missed.start, missed.stop - 1)
    warnings.append(
        f"decode batches of {eager[0]}..{eager[1]} requests are above the largest captured size "
        f"{max(chosen)} and run eagerly"
    )
    return eager
