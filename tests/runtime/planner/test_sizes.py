"""Capture-size lists against vLLM's own rules and the cases of vllm-ascend #16049."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from npu_runtime.planner import sizes


def test_grid_is_vllms() -> None:
    # vllm/config/vllm.py: [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max + 1, 16))
    assert sizes.grid(512) == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    assert sizes.grid(12) == [1, 2, 4, 8]
    assert sizes.grid(3) == [1, 2]


def test_vllm_ascend_default_leaves_12_uncovered() -> None:
    # vllm-ascend #16049: max_num_seqs=12 captures only [1, 2, 4, 8]; batches 9-12 decode eagerly.
    captured = sizes.vllm_ascend_default_sizes(12)
    assert captured == [1, 2, 4, 8]
    assert list(sizes.uncovered(captured, 12)) == [9, 10, 11, 12]


def test_vllm_default_appends_max_num_seqs_up_to_512_only() -> None:
    assert sizes.vllm_default_sizes(12) == [1, 2, 4, 8, 12, 16, 24]
    assert not sizes.uncovered(sizes.vllm_default_sizes(12), 12)
    assert list(sizes.uncovered(sizes.vllm_default_sizes(600), 600)) == list(range(513, 601))


def test_covering_sizes() -> None:
    assert sizes.covering_sizes(12, 1, 12) == (1, 2, 4, 8, 12)
    assert sizes.covering_sizes(3, 1, 3) == (1, 2, 3)
    # Speculative decoding: whole requests of 1 + k tokens each.
    assert sizes.covering_sizes(12, 3, 36) == (3, 6, 12, 24, 36)
    # A lower explicit ceiling cuts the list and is itself captured.
    assert sizes.covering_sizes(300, 1, 100) == (1, 2, 4, *range(8, 97, 8), 100)


@given(st.integers(1, 2048), st.integers(1, 5))
def test_covering_sizes_cover_every_decode_batch(max_num_seqs: int, q: int) -> None:
    captured = sizes.covering_sizes(max_num_seqs, q, max_num_seqs * q)
    assert captured[-1] == max_num_seqs * q
    assert all(s % q == 0 for s in captured)
    assert list(captured) == sorted(set(captured))
    assert not sizes.uncovered(captured, max_num_seqs, q)


@pytest.mark.parametrize(
    ("given_sizes", "problem"),
    [
        ((), "at least one"),
        ((0, 4), "size 0 (position 1) must be positive"),
        ((1, 4, 4), "size 4 (position 3) must be larger than the one before it (4)"),
        ((1, 8, 2), "size 2 (position 3)"),
        ((1, 2, 300), "size 300 is above the ceiling 256"),
    ],
)
def test_validate_sizes(given_sizes: tuple[int, ...], problem: str) -> None:
    message = sizes.validate_sizes(given_sizes, 256, 1)
    assert message is not None
    assert problem in message


def test_validate_sizes_with_speculative_tokens() -> None:
    assert sizes.validate_sizes((2, 4, 6), 6, 2) is None
    message = sizes.validate_sizes((2, 5), 6, 2)
    assert message is not None
    assert "size 5 is not a multiple of 1 + speculative tokens = 2" in message


@given(st.integers(1, 200))
def test_thinning_order_is_a_permutation(count: int) -> None:
    order = sizes.thinning_order(count)
    assert sorted(order) == list(range(count))
    assert order[0] == count - 1
    if count > 1:
        assert order[1] == 0


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=120, unique=True), st.integers(1, 130))
def test_thinning_is_nested_and_keeps_the_ends(values: list[int], keep: int) -> None:
    ordered = sorted(values)
    smaller, larger = sizes.thin(ordered, keep), sizes.thin(ordered, keep + 1)
    assert set(smaller) <= set(larger)
    assert len(smaller) == min(keep, len(ordered))
    assert smaller[-1] == ordered[-1]
    if keep >= 2:
        assert smaller[0] == ordered[0]


def test_thinning_spreads_the_kept_sizes() -> None:
    assert sizes.thin(list(range(1, 10)), 3) == (1, 5, 9)
    assert sizes.thin(list(range(1, 10)), 5) == (1, 3, 5, 7, 9)
