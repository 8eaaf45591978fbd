"""Equal specs kept once: `SharedDocuments` (the workers' copies of the resources, see test_worker) and
`typed_spec` (the workers' typed specs), both keyed by the content, never by the name."""

from __future__ import annotations

import copy
import gc
from typing import Any

import yaml
from npu_operator.controller import desired
from npu_operator.controller.desired import typed_spec
from npu_operator.kube.objects import SharedDocuments, document_digest

from tests.examples import EXAMPLES


def _spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / "sandbox-cpu.yaml").read_text())["spec"]
    return spec


def test_equal_documents_are_one_copy_and_a_different_one_is_its_own() -> None:
    shared = SharedDocuments()
    first = shared.share("a", 1, _spec())
    assert shared.share("b", 1, _spec()) is first  # parsed apart, equal: one copy
    other = _spec() | {"replicas": 3}
    assert shared.share("c", 1, other) == other and shared.share("c", 1, other) is not first
    assert len(shared) == 2


def test_the_same_version_costs_no_comparison_and_a_new_one_is_shared_again() -> None:
    shared = SharedDocuments()
    first = shared.share("a", 1, _spec())
    # Same holder, same version: the held copy, whatever is passed (a generation is one spec).
    assert shared.share("a", 1, {"not": "read"}) is first
    changed = shared.share("a", 2, _spec() | {"replicas": 2})
    assert changed["replicas"] == 2 and len(shared) == 1  # the old copy had no other holder: gone


def test_a_copy_goes_with_its_last_holder() -> None:
    shared = SharedDocuments()
    shared.share("a", 1, _spec())
    shared.share("b", 1, _spec())
    shared.release("a")
    assert len(shared) == 1
    shared.release("b")
    shared.release("b")  # a second release (a repeated DELETED event) is nothing
    assert len(shared) == 0


def test_key_order_does_not_matter() -> None:
    spec = _spec()
    reordered = dict(reversed(list(spec.items())))
    assert document_digest(spec) == document_digest(reordered)
    assert document_digest(spec) != document_digest(spec | {"replicas": 7})


def test_equal_specs_read_into_one_typed_spec_which_goes_when_unused() -> None:
    first, second = typed_spec(_spec()), typed_spec(copy.deepcopy(_spec()))
    assert first is second
    assert typed_spec(_spec() | {"replicas": 5}) is not first
    digest = document_digest(_spec())
    del first, second
    gc.collect()
    assert digest not in desired._TYPED_SPECS
