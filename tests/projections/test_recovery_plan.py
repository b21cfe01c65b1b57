"""Recovery as a pure rule (DOMAIN §4.2 R7, §5.7 D10, D18; issue 23 step 5): ``plan_recovery``
decides, the engine's one cleanup executor (``engine_bridge.cleanup.execute_recovery``) plays
the steps — here on a recording stub log that folds every event through ``evolve`` and stub
ports (aborts fail when the generated case says so), no engine, no store.

On generated histories (hypothesis: ids reserved, submitted, forwarded, finished, released,
aborts logged with or without an answer, failed answers, failed releases), generated live-id
sets and shared/not shared engines:

* the plan is pure and deterministic: the same inputs give the same steps, the fold is not
  touched by planning;
* played with every abort answered ``ok``, the session holds nothing afterwards (no key, no
  abort unanswered or failed, no failed release), and no pool is asked twice for one id;
* played with failing aborts, what the session still holds is exactly what a failed abort
  restored (R3), and each such failure is reported;
* an id is only recorded lost or released without an engine call where no engine this replica
  reaches can run it (not live, and for a submitted one not shared).
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decider import SessionState, evolve, plan_recovery, plan_takeover, settle_aborts
from decider.commands import Cleanup, Reabort, Record, SettleAborts, Then
from engine_bridge.cleanup import RecoveryOutcome, execute_recovery
from engine_bridge.ports import AbortFailed
from events.records import StoredEvent
from events.structs import struct_of
from events.types import EventBase, StageRequestLost, StageRequestReleased
from projections.resources import ResourcesFold, SessionResources
from tests.logbuilder import LogBuilder, eph

SID = "s-rec"
IDS = [eph(SID, turn) for turn in range(3)]

OPS = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 2)),
    st.tuples(st.just("submit"), st.integers(0, 2)),
    st.tuples(st.just("forward"), st.integers(0, 2)),
    st.tuples(st.just("finish"), st.integers(0, 2), st.integers(0, 1)),
    st.tuples(st.just("release_key"), st.integers(0, 2), st.integers(0, 1)),
    st.tuples(st.just("abort"), st.integers(0, 2), st.sampled_from([None, (0,), (1,), (0, 1)])),
    st.tuples(st.just("answer"), st.integers(0, 2), st.integers(0, 1), st.sampled_from(["ok", "failed"])),
    st.tuples(st.just("release_failed"), st.integers(0, 2)),
)


def history(ops: list[tuple[Any, ...]]) -> list[StoredEvent]:
    """A dead owner's log: the session opened, then ``ops`` on the ids of :data:`IDS`."""
    b = LogBuilder()
    b.add("SessionOpened", SID, 1.0)
    for n, op in enumerate(ops):
        ts = 2.0 + n / 100
        kind, rid = op[0], IDS[op[1]]
        fence = {"turn_id": op[1]}
        if kind == "reserve":
            b.add("StageRequestReserved", SID, ts, stage_id=0, request_id=rid, fence=fence)
        elif kind == "submit":
            b.add("StageRequestSubmitted", SID, ts, stage_id=0, request_id=rid, fence=fence)
        elif kind == "forward":
            b.add("StageRequestForwarded", SID, ts, stage_id=1, request_id=rid, fence=fence)
        elif kind == "finish":
            b.add("StageRequestFinished", SID, ts, stage_id=op[2], request_id=rid, finish_reason="stop")
        elif kind == "release_key":
            b.add("StageRequestReleased", SID, ts, stage_id=op[2], request_id=rid, cause="end_of_turn")
        elif kind == "abort":
            stage_ids = list(op[2]) if op[2] is not None else None
            b.add("AbortRequested", SID, ts, request_ids=[rid], stage_ids=stage_ids, reason="barge_in")
        elif kind == "answer":
            error = "boom" if op[3] == "failed" else None
            b.add("AbortResult", SID, ts, request_ids=[rid], stage_id=op[2], outcome=op[3], error=error)
        else:
            b.add("ReleaseRequested", SID, ts, request_ids=[rid], cause="close")
            b.add("ReleaseResult", SID, ts, request_ids=[rid], outcome="failed", error="boom")
    return b.stored


def folded(ops: list[tuple[Any, ...]]) -> SessionState:
    state = SessionState(SID, ResourcesFold())
    for stored in history(ops):
        evolve(state, stored)
    return state


@dataclass
class _Port:
    """A recording stub port: each abort is logged; the ids in ``failing`` fail to abort."""

    stage_id: int
    failing: frozenset[str] = frozenset()
    calls: list[str] = field(default_factory=list)

    async def abort(self, request_ids: list[str]) -> None:
        self.calls.extend(request_ids)
        if set(request_ids) & self.failing:
            raise AbortFailed(f"stub abort failure on stage {self.stage_id}")


@dataclass
class StubLog:
    """The SessionLog surface the executor uses; every event is folded through ``evolve``."""

    state: SessionState
    written: list[EventBase] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return SID

    @property
    def projector(self) -> StubLog:
        return self

    def session_resources(self, session_id: str) -> SessionResources | None:
        return self.state.fold.sessions.get(session_id)

    def emit_later(self, *events: EventBase) -> None:
        for event in events:
            n = self.state.resources.last_position + 1
            evolve(self.state, StoredEvent(n, SID, n, event.ts, struct_of(event)))
            self.written.append(event)

    async def emit(self, *events: EventBase) -> None:
        self.emit_later(*events)


def play(
    ops: list[tuple[Any, ...]], live: frozenset[str], shared: bool, failing: frozenset[str] = frozenset()
) -> tuple[StubLog, list[_Port], RecoveryOutcome]:
    log = StubLog(folded(ops))
    ports = [_Port(0, failing), _Port(1, failing)]
    steps = plan_recovery(log.session_resources(SID), live, shared, ts=50.0)
    outcome = asyncio.run(execute_recovery(log, ports, steps))  # type: ignore[arg-type]
    return log, ports, outcome


def shape(steps: list[Any]) -> list[Any]:
    """Steps with each event as (type, payload): event ids are minted per event."""
    out: list[Any] = []
    for step in steps:
        if isinstance(step, Record):
            out.append(("Record", step.durable, [(e.type, e.payload()) for e in step.events]))
        else:
            out.append(step)
    return out


def unsettled(resources: SessionResources) -> set[str]:
    """Ids the session still holds: a key, or an abort/release unanswered or failed."""
    held = {key[1] for key in resources.bindings}
    return held | {
        rid
        for rid, life in resources.lives.items()
        if not life.cleanup_ok and (life.abort_pending or life.abort_failed)
    }


LIVE = st.frozensets(st.sampled_from(IDS))
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(ops=st.lists(OPS, max_size=14), live=LIVE, shared=st.booleans())
def test_the_plan_is_pure_and_deterministic(ops, live, shared):
    state = folded(ops).resources
    before = copy.deepcopy(state)
    first = plan_recovery(state, live, shared, ts=50.0)
    again = plan_recovery(copy.deepcopy(state), set(live), shared, ts=50.0)
    assert shape(first) == shape(again)
    assert state == before  # planning folds nothing
    assert isinstance(first[-1], Then) and first[-1].command == SettleAborts(50.0, live, shared)
    settle = SettleAborts(51.0, live, shared)
    assert shape(settle_aborts(state, settle)) == shape(settle_aborts(before, settle))
    assert state == before


@SETTINGS
@given(ops=st.lists(OPS, max_size=14), live=LIVE, shared=st.booleans())
def test_with_every_abort_answered_the_session_holds_nothing_and_no_pool_is_asked_twice(ops, live, shared):
    log, ports, outcome = play(ops, live, shared)
    resources = log.state.resources
    assert unsettled(resources) == set(), resources
    assert not resources.holds_anything()
    for port in ports:
        assert max(Counter(port.calls).values(), default=0) <= 1, port.calls
    assert outcome.failed == []
    lost = [(e.stage_id, e.request_id) for e in log.written if isinstance(e, StageRequestLost)]
    assert outcome.lost == lost
    assert all(e.cause == "recovered_after_crash" for e in log.written if hasattr(e, "cause"))


@SETTINGS
@given(ops=st.lists(OPS, max_size=14), live=LIVE, shared=st.booleans(), failing=LIVE)
def test_a_failed_abort_leaves_exactly_its_id_held_and_is_reported(ops, live, shared, failing):
    log, ports, outcome = play(ops, live, shared, failing)
    asked = {rid for port in ports for rid in port.calls}
    still = unsettled(log.state.resources)
    assert still <= asked & failing  # only a failed abort leaves anything held (R3)
    if asked & failing:
        assert outcome.failed
    assert all(rid not in failing for rid in outcome.aborted)


@SETTINGS
@given(ops=st.lists(OPS, max_size=14), live=LIVE, shared=st.booleans())
def test_only_ids_no_reachable_engine_runs_are_ended_without_an_engine_call(ops, live, shared):
    state = folded(ops).resources
    steps = plan_recovery(state, live, shared, ts=50.0)
    for step in steps:
        if isinstance(step, Cleanup):
            keys = [b for (_, rid), b in state.bindings.items() if rid == step.request_id]
            assert step.force_abort and step.collect
            assert step.request_id in live or (shared and any(b.submitted for b in keys))
        elif isinstance(step, Record):
            for event in step.events:
                assert isinstance(event, StageRequestLost | StageRequestReleased)
                assert event.request_id not in live
                binding = state.bindings[(event.stage_id, event.request_id)]
                assert isinstance(event, StageRequestLost) == binding.submitted
                assert not (shared and binding.submitted)
        else:
            assert isinstance(step, Then)
    for step in settle_aborts(state, SettleAborts(51.0, live, shared)):
        if isinstance(step, Reabort):
            assert step.request_id in live or shared
        elif isinstance(step, Record):
            for event in step.events:
                if isinstance(event, StageRequestLost):
                    assert event.request_id not in live and not shared


def test_a_running_id_on_a_dead_engine_is_lost_and_a_reserved_one_released():
    ops = [("submit", 0), ("forward", 0), ("reserve", 1)]
    log, ports, outcome = play(ops, frozenset(), shared=False)
    assert [(e.type, e.stage_id, e.request_id) for e in log.written] == [
        ("StageRequestLost", 0, IDS[0]),
        ("StageRequestLost", 1, IDS[0]),
        ("StageRequestReleased", 0, IDS[1]),
    ]
    assert outcome.lost == [(0, IDS[0]), (1, IDS[0])] and all(not p.calls for p in ports)


def test_an_unanswered_abort_is_sent_again_on_shared_engines_and_answered_per_pool():
    ops = [("submit", 0), ("release_key", 0, 0), ("abort", 0, None), ("answer", 0, 0, "failed")]
    log, ports, outcome = play(ops, frozenset(), shared=True)
    assert [(e.type, getattr(e, "stage_ids", None), getattr(e, "stage_id", None)) for e in log.written] == [
        ("AbortRequested", [0], None),  # a new intent for the failed pool only (D10)
        ("AbortResult", None, 0),
        ("AbortResult", None, 1),  # the pending pool is answered under the dead owner's intent
    ]
    assert [p.calls for p in ports] == [[IDS[0]], [IDS[0]]] and outcome.aborted == [IDS[0], IDS[0]]


@SETTINGS
@given(ops=st.lists(OPS, max_size=14), session_open=st.booleans())
def test_an_open_session_is_closed_durably_first_a_closed_one_only_when_it_holds_something(ops, session_open):
    state = folded(ops).resources
    plan = plan_takeover(
        state,
        SID,
        session_open=session_open,
        replica_id="B",
        replica_incarnation=2,
        previous_replica_id="A",
        previous_incarnation=1,
        detected="lease_expired",
        ts=50.0,
    )
    if not session_open:
        assert plan == ([] if unsettled(state) else None)
        return
    assert plan is not None
    (record,) = plan
    assert isinstance(record, Record) and record.durable
    taken, closed = record.events
    assert (taken.type, taken.replica_id, taken.previous_replica_id, taken.previous_incarnation) == (
        "SessionTakenOver",
        "B",
        "A",
        1,
    )
    assert (closed.type, closed.reason) == ("SessionClosed", "recovered_after_crash")
