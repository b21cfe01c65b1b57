"""The verdict on an abort does not depend on the order its pools answer in (hostile retest
F1: an ``ok`` from pool 0 before a ``failed`` from pool 1 was marked clean, so the failure was
neither a leak nor retried by recovery; the other order was a leak). Generated over the
outcome of each pool, the order of the answers, and whether the keys were dropped before the
abort (a close) or are dropped by the answers."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from projections.projector import Projector
from tests.logbuilder import LogBuilder, eph

X = eph("s1", 0)
OUTCOMES = ("ok", "failed", "not_running", "unknown_id")


def history(outcomes: tuple[str, str], order: tuple[int, ...], released_first: bool) -> LogBuilder:
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    b.add("StageRequestReserved", "s1", 1.1, stage_id=0, request_id=X)
    b.add("StageRequestSubmitted", "s1", 1.2, stage_id=0, request_id=X)
    b.add("StageRequestForwarded", "s1", 1.3, stage_id=1, request_id=X)
    b.add("SessionClosed", "s1", 2.0)
    if released_first:
        for stage_id in (0, 1):
            b.add("StageRequestReleased", "s1", 2.1, stage_id=stage_id, request_id=X)
    b.add("AbortRequested", "s1", 2.2, request_ids=[X])
    for i, stage_id in enumerate(order):
        b.add("AbortResult", "s1", 2.3 + i / 10, request_ids=[X], stage_id=stage_id, outcome=outcomes[stage_id])
    return b


def verdict(b: LogBuilder) -> tuple[bool, bool]:
    p = Projector().apply_all(b.stored)
    return bool(p.leaks()), p.session_resources("s1").holds_anything()


@given(st.tuples(st.sampled_from(OUTCOMES), st.sampled_from(OUTCOMES)), st.booleans())
def test_an_aborts_verdict_is_the_same_in_every_answer_order(outcomes: tuple[str, str], released_first: bool) -> None:
    verdicts = {verdict(history(outcomes, order, released_first)) for order in itertools.permutations((0, 1))}
    assert len(verdicts) == 1, (outcomes, released_first, verdicts)
    leaked, holding = verdicts.pop()
    failed = "failed" in outcomes
    assert leaked == failed and holding == failed, (outcomes, released_first)
