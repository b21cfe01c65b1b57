"""The cleanup rule as a pure plan (DOMAIN §4.2 R1–R3, R7; issue 13: the engine only executes
it): release or abort, which keys drop, what a failed abort restores."""

from __future__ import annotations

import pytest

from decider.cleanup import plan_cleanup
from projections.projector import Projector
from tests.logbuilder import LogBuilder, eph

X0 = eph("s1", 0)


def _state(*, forwarded: bool, finished: bool, submitted: bool = True):
    b = LogBuilder()
    b.add("SessionOpened", "s1", 1.0)
    if submitted:
        b.add("StageRequestSubmitted", "s1", 2.0, stage_id=0, request_id=X0, fence={"turn_id": 0})
    else:
        b.add("StageRequestReserved", "s1", 2.0, stage_id=0, request_id=X0, fence={"turn_id": 0})
    if forwarded:
        b.add("StageRequestForwarded", "s1", 2.1, stage_id=1, request_id=X0, fence={"turn_id": 0})
    if finished:
        for stage_id in (0, 1) if forwarded else (0,):
            b.add("StageRequestFinished", "s1", 2.2, stage_id=stage_id, request_id=X0, finish_reason="stop")
    return Projector().apply_all(b.stored).session_resources("s1")


@pytest.mark.parametrize(
    ("forwarded", "finished", "submitted", "force", "abort"),
    [
        (False, True, True, False, False),  # finished: released, no engine call
        (True, True, True, False, False),
        (False, False, True, False, True),  # still running: aborted on every pool
        (True, False, True, False, True),
        (False, False, False, False, False),  # reserved only: released
        (False, False, False, True, True),  # forced (takeover, lost pipelined intent): aborted
        (True, True, True, True, True),
    ],
)
def test_release_or_abort(forwarded, finished, submitted, force, abort):
    state = _state(forwarded=forwarded, finished=finished, submitted=submitted)
    plan = plan_cleanup(state, "s1", X0, cause="end_of_turn", ts=5.0, force_abort=force)
    assert plan.abort is abort
    dropped = [(e.type, e.stage_id) for e in plan.intent if e.type == "StageRequestReleased"]
    assert dropped == [("StageRequestReleased", s) for s in ((0, 1) if forwarded else (0,))]  # R1: every key
    assert plan.intent[-1].type == ("AbortRequested" if abort else "ReleaseRequested")
    assert {e.ts for e in plan.intent} == {5.0}


def test_a_failed_abort_restores_exactly_the_dropped_keys():
    plan = plan_cleanup(_state(forwarded=True, finished=False), "s1", X0, cause="barge_in", ts=5.0)
    restored = plan.restored(6.0)
    assert [(e.stage_id, e.submitted, e.fence.turn_id) for e in restored] == [(0, True, 0), (1, True, 0)]
    assert plan.abort_result(1, 6.0, "boom").outcome == "failed" and plan.abort_result(0, 6.0).outcome == "ok"


def test_an_unknown_session_or_id_is_a_release_of_nothing():
    plan = plan_cleanup(None, "s1", X0, cause="close", ts=5.0)
    assert (plan.abort, plan.keys, [e.type for e in plan.intent]) == (False, (), ["ReleaseRequested"])
