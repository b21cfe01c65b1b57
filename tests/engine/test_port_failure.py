"""Port failures reach the rules as a kind, not an exception's class name (issue 23 step 5):
``engine_bridge.ports.port_failure`` maps the port's exception, ``FailTurn`` carries the kind
and the decided ``CommandRejected`` and client ``error`` carry its wire code."""

from __future__ import annotations

import pytest

from decider import FailTurn, Notify, PortFailure, Record, SessionState, TurnRef, decide, evolve
from engine_bridge.ports import AbortFailed, EngineDead, PromptTooLong, StagePortError, port_failure
from events.types import CommandRejected
from projections.resources import ResourcesFold
from tests.logbuilder import LogBuilder, eph

SID = "s-fail"
X0 = eph(SID, 0)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (PromptTooLong("too long", X0), PortFailure.PROMPT_TOO_LONG),
        (EngineDead("gone"), PortFailure.ENGINE_DEAD),
        (AbortFailed("no"), PortFailure.STAGE_ERROR),
        (StagePortError("other"), PortFailure.STAGE_ERROR),
        (RuntimeError("not a port's"), PortFailure.STAGE_ERROR),
    ],
)
def test_a_port_exception_maps_to_its_kind(exc, kind):
    assert port_failure(exc) is kind


@pytest.mark.parametrize("kind", list(PortFailure))
def test_a_failed_turn_is_refused_with_the_kind_s_wire_code(kind):
    b = LogBuilder()
    b.add("SessionOpened", SID, 1.0)
    b.add("StageRequestSubmitted", SID, 2.0, stage_id=0, request_id=X0, fence={"turn_id": 0})
    state = SessionState(SID, ResourcesFold())
    for stored in b.stored:
        evolve(state, stored)
    steps = decide(state, FailTurn(3.0, TurnRef(X0, 0, 0, 0, "resp-1"), kind, "boom", "partial"))
    rejected = [e for s in steps if isinstance(s, Record) for e in s.events if isinstance(e, CommandRejected)]
    errors = [s for s in steps if isinstance(s, Notify) and s.type == "error"]
    assert [e.error_code for e in rejected] == [kind.value]
    assert [n.data.get("code") for n in errors] == [kind.value]
    assert kind.code == {"PROMPT_TOO_LONG": "prompt_too_long", "ENGINE_DEAD": "engine_dead"}.get(
        kind.name, "stage_error"
    )
