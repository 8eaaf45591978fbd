"""Capture-size lists: vLLM's grid, the planner's covering list, validation and thinning.

A decode step of n requests with k speculative tokens is a batch of n * (1 + k) tokens; in a
FULL decode mode it replays the smallest captured graph at least that large, or runs eagerly when
there is none (vLLM pads up to the next captured size; batches above the largest run eagerly).
The planner therefore always captures the ceiling `max_num_seqs * (1 + k)`, which vLLM's default
list leaves out when max_num_seqs is off its grid (vllm-ascend #16049).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

# vLLM's default ceiling without a user setting: 512 (1024 on data-center Blackwell)
# (vllm/config/vllm.py VllmConfig._set_cudagraph_sizes).
ENGINE_DEFAULT_MAX_CAPTURE: Final = 512
# vLLM's smallest default max_num_batched_tokens for the OpenAI server (EngineArgs.get_batch_defaults:
# below 70 GiB of device memory and on CPU).
ENGINE_MIN_BATCHED_TOKENS: Final = 2048


def grid(ceiling: int) -> list[int]:
    """vLLM's grid up to `ceiling`: 1, 2, 4, then steps of 8 below 256, then steps of 16.

    Source: vllm/config/vllm.py VllmConfig._set_cudagraph_sizes.
    """
    sizes = [n for n in (1, 2, 4) if n <= ceiling]
    sizes += list(range(8, min(ceiling + 1, 256), 8))
    sizes += list(range(256, ceiling + 1, 16))
    return sizes


def covering_sizes(max_num_seqs: int, decode_query_len: int, ceiling: int) -> tuple[int, ...]:
    """The planner's list: vLLM's grid in requests, times the decode query length, plus the ceiling.

    Every entry is a multiple of `decode_query_len` (vLLM rounds sizes to that multiple for FULL
    decode graphs with speculative decoding, CompilationConfig.adjust_cudagraph_sizes_for_spec_decode,
    and dispatch needs an exact multiple), and `ceiling` (normally max_num_seqs * decode_query_len)
    is always the last, so every decode batch of 1..max_num_seqs requests has a graph.
    """
    requests = [*grid(max_num_seqs), max_num_seqs]
    sizes = {n * decode_query_len for n in requests if n * decode_query_len <= ceiling}
    sizes.add(ceiling)
    return tuple(sorted(sizes))


def validate_sizes(sizes: Sequence[int], ceiling: int, decode_query_len: int) -> str | None:
    """Why an explicit list is invalid, naming the bad value; None when it is valid."""
    if not sizes:
        return "must list at least one size"
    previous = 0
    for position, size in enumerate(sizes):
        if size < 1:
            return f"size {size} (position {position + 1}) must be positive"
        if size <= previous:
            return f"size {size} (position {position + 1}) must be larger than the one before it ({previous})"
        if size > ceiling:
            return f"size {size} is above the ceiling {ceiling} (max capture size)"
        if decode_query_len > 1 and size % decode_query_len:
            return (
                f"size {size} is not a multiple of 1 + speculative tokens = {decode_query_len}; "
                "vLLM would round it up or drop it"
            )
        previous = size
    return None


def thinning_order(count: int) -> list[int]:
    """Indices 0..count-1 in the order a list keeps them when it must shrink.

    The largest first, then the smallest, then the middle of each remaining gap, breadth first.
    Any prefix of this order is the kept set, so a list thinned to k sizes is always a subset of
    the same list thinned to k + 1 (more memory or streams never removes a size), and every kept
    set holds the smallest and the largest size.
    """
    if count <= 0:
        return []
    if count == 1:
        return [0]
    order = [count - 1, 0]
    gaps = [(0, count - 1)]
    while gaps:
        next_gaps: list[tuple[int, int]] = []
        for low, high in gaps:
            if high - low < 2:
                continue
            middle = (low + high) // 2
            order.append(middle)
            next_gaps += [(low, middle), (middle, high)]
        gaps = next_gaps
    return order


def thin(sizes: Sequence[int], keep: int) -> tuple[int, ...]:
    """`sizes` (sorted) thinned to `keep` entries, keeping the smallest and the largest."""
    if keep >= len(sizes):
        return tuple(sizes)
    kept = sorted(thinning_order(len(sizes))[: max(keep, 0)])
    return tuple(sizes[i] for i in kept)


# -- what the engines capture by default (for comparison, e.g. scripts/bench_planner.py) ------------


def vllm_default_sizes(max_num_seqs: int, max_num_batched_tokens: int = ENGINE_MIN_BATCHED_TOKENS) -> list[int]:
    """vLLM 0.31's default capture list without speculative decoding (CUDA platforms).

    vllm/config/vllm.py VllmConfig._set_cudagraph_sizes: ceiling min(2 * max_num_seqs, 512) capped
    by max_num_batched_tokens, the grid, max_num_batched_tokens when it fits, and max_num_seqs
    when it fits within the ceiling.
    """
    ceiling = min(max_num_seqs * 2, ENGINE_DEFAULT_MAX_CAPTURE, max_num_batched_tokens)
    sizes = grid(ceiling)
    if max_num_batched_tokens <= ceiling:
        sizes.append(max_num_batched_tokens)
    if max_num_seqs <= ceiling:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


def vllm_ascend_default_sizes(max_num_seqs: int, max_num_batched_tokens: int = ENGINE_MIN_BATCHED_TOKENS) -> list[int]:
    """vllm-ascend's default capture list without speculative decoding.

    vllm_ascend/platform.py _get_default_max_cudagraph_capture_size presets the ceiling to
    min(max_num_seqs, 512) (no "* 2"), so vLLM's _set_cudagraph_sizes sees an explicit ceiling and
    does not append max_num_seqs: an off-grid max_num_seqs of 12 captures [1, 2, 4, 8] (#16049).
    """
    ceiling = min(max_num_seqs, ENGINE_DEFAULT_MAX_CAPTURE, max_num_batched_tokens)
    sizes = grid(ceiling)
    if max_num_batched_tokens <= ceiling:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def uncovered(sizes: Sequence[int], max_num_seqs: int, decode_query_len: int = 1) -> range:
    """Decode batch sizes (in requests) that no captured size covers: they run eagerly."""
    largest = max(sizes, default=0) // decode_query_len
    return range(min(largest, max_num_seqs) + 1, max_num_seqs + 1)
