"""Pure batch planning: per-call decisions inside one group-commit batch."""

from __future__ import annotations

from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.chain import row_pieces
from events.store.errors import ConcurrencyError, EventIdConflict
from events.store.planning import AppendCall, BatchState, CallResult, Existing, plan_call, plan_calls
from events.store.rows import NewRow
from events.types import new_event_id, ts_to_us


def row(stream: str, eid: str, version: int | None = None) -> NewRow:
    return NewRow(stream, eid, "TurnCommitted", 1, 1, "{}", version=version)


def encoded(stream: str, eid: str) -> NewRow:
    """A row as :meth:`EventStore.append` hands it on: its chain pieces encoded."""
    return row(stream, eid).check()


def test_calls_in_one_batch_see_each_other() -> None:
    state = BatchState(head=10, versions={"A": 2})
    r1 = plan_call(state, AppendCall([row("A", "a3")], "A", 2), now_us=5)
    r2 = plan_call(state, AppendCall([row("A", "a4"), row("A", "a5")], "A", 3), now_us=5)
    assert (r1.positions, r2.positions) == ([11], [12, 13])
    assert [(r[0], r[2]) for r in state.inserts] == [(11, 3), (12, 4), (13, 5)]


def test_plan_calls_decides_as_plan_call_call_by_call() -> None:
    """The batch planner's inline path (one new event, version as expected) gives the same
    outcomes, positions, chain hashes and state as plan_call for every call in turn, on a batch
    mixing it with what it hands on: a stale version, a re-sent id (stored, and planned earlier
    in the batch), a foreign id, several rows (inline too, or handed on), no version check, bulk."""
    stored = {"old": Existing("A", 2, 7, "TurnCommitted", 1, 1, "{}")}
    calls = [
        AppendCall([encoded("A", "a3")], "A", 2),
        AppendCall([encoded("A", "a4")], "A", 2),  # stale: ConcurrencyError
        AppendCall([encoded("A", "a3")], "A", 3),  # re-sent within the batch, version matching: its position
        AppendCall([encoded("B", "old")], "B", 0),  # stored in another stream: EventIdConflict
        AppendCall([encoded("A", "old")], "A", 3),  # stored: original position, nothing written
        AppendCall([encoded("B", "b1")], "B", None),
        AppendCall([row("B", "b1p")], "B", 1),  # pieces not encoded (a row built by hand)
        AppendCall([encoded("B", "b2"), encoded("B", "b3")], "B", 2),
        AppendCall([encoded("B", "b4"), encoded("B", "b2")], "B", 4),  # several rows, one planned: EventIdConflict
        AppendCall([encoded("B", "b5"), encoded("B", "b6")], "B", 2),  # several rows, stale: ConcurrencyError
        AppendCall([encoded("B", "b7"), row("B", "b8")], "B", 4),  # several rows, one without pieces
        AppendCall([row("C", "c1"), row("A", "a5", version=4)], bulk=True),
        AppendCall([encoded("A", "a6")], "A", 4),
    ]

    def fresh() -> BatchState:
        return BatchState(head=7, head_hash=bytes(range(32)), versions={"A": 2}, existing=dict(stored))

    one_by_one, expected = fresh(), []
    for call in calls:
        try:
            result = plan_call(one_by_one, call, now_us=5)
            expected.append(result if call.bulk else result.positions)  # the value its caller gets
        except (ConcurrencyError, EventIdConflict) as exc:
            expected.append(exc)
    batched = fresh()
    outcomes = plan_calls(batched, calls, now_us=5)

    def shape(o: object) -> object:
        return type(o).__name__ if isinstance(o, Exception) else o

    assert [shape(o) for o in outcomes] == [shape(o) for o in expected]
    assert [shape(o) for o in outcomes] == [
        [8],
        "ConcurrencyError",
        [8],
        "EventIdConflict",
        [7],
        [9],
        [10],
        [11, 12],
        "EventIdConflict",
        "ConcurrencyError",
        [13, 14],
        CallResult([15, 16], 2),
        [17],
    ]
    assert batched.inserts == one_by_one.inserts and len(batched.inserts) == 10
    assert (batched.head, batched.head_hash, batched.versions) == (
        one_by_one.head,
        one_by_one.head_hash,
        one_by_one.versions,
    )


def test_failed_call_leaves_state_untouched() -> None:
    state = BatchState(head=10, versions={"A": 2})
    with pytest.raises(ConcurrencyError):
        plan_call(state, AppendCall([row("A", "x")], "A", 1), now_us=5)
    assert state.head == 10 and state.inserts == [] and "x" not in state.existing
    with pytest.raises(ConcurrencyError):
        plan_call(state, AppendCall([row("B", "y1"), row("B", "y2", version=5)], bulk=True), now_us=5)
    assert state.head == 10 and state.inserts == [] and "B" not in state.versions


def test_duplicate_retry_inside_batch_is_idempotent() -> None:
    state = BatchState(head=0)
    first = plan_call(state, AppendCall([row("A", "e1")], "A", 0), now_us=5)
    again = plan_call(state, AppendCall([row("A", "e1")], "A", 0), now_us=5)
    assert first.positions == again.positions == [1] and again.appended == 0
    assert len(state.inserts) == 1


def test_partial_and_foreign_ids() -> None:
    state = BatchState(head=3, existing={"e1": Existing("A", 1, 1, "TurnCommitted", 1, 1, "{}")})
    with pytest.raises(EventIdConflict, match="only part"):
        plan_call(state, AppendCall([row("A", "e1"), row("A", "new")], "A"), now_us=5)
    with pytest.raises(EventIdConflict, match="another stream"):
        plan_call(state, AppendCall([row("B", "e1")], "B"), now_us=5)
    with pytest.raises(EventIdConflict, match="another stream"):
        plan_call(state, AppendCall([row("B", "e1")], bulk=True), now_us=5)


def test_bulk_keeps_given_recorded_at() -> None:
    state = BatchState(head=0)
    r = NewRow("A", "e", "T", 1, 7, "{}", recorded_at_us=42)
    plan_call(state, AppendCall([r, row("A", "f")], bulk=True), now_us=99)
    assert [x[7] for x in state.inserts] == [42, 99]


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize(
    ("changed", "field"),
    [
        (NewRow("A", "e1", "TurnCommitted", 1, 2, '{"turn_id":0}'), "ts"),
        (NewRow("A", "e1", "TurnCommitted", 1, 1, '{"turn_id":1}'), "data"),
        (NewRow("A", "e1", "TurnCommitted", 1, 1, '{"turn_id":0.0}'), "data"),
        (NewRow("A", "e1", "SessionClosed", 1, 1, '{"turn_id":0}'), "type"),
        (NewRow("A", "e1", "TurnCommitted", 2, 1, '{"turn_id":0}'), "schema_version"),
    ],
)
def test_same_id_with_other_content_is_a_conflict(changed: NewRow, field: str, bulk: bool) -> None:
    """Issue 11 point 4: same id + same content = no-op; same id + other content = conflict."""
    state = BatchState(head=1, existing={"e1": Existing("A", 1, 1, "TurnCommitted", 1, 1, '{"turn_id":0}')})
    with pytest.raises(EventIdConflict, match=f"different content \\({field} differ"):
        plan_call(state, AppendCall([changed], None if bulk else "A", bulk=bulk), now_us=5)
    same = NewRow("A", "e1", "TurnCommitted", 1, 1, '{ "turn_id": 0 }')  # spacing is not content
    assert plan_call(state, AppendCall([same], None if bulk else "A", bulk=bulk), now_us=5).positions == [1]
    assert state.inserts == []


def test_checked_row_is_from_event_then_check_and_refuses_alike() -> None:
    """NewRow.checked (the append's one-step row) gives the same row and pieces as
    from_event(...).check(), and the same InvalidRow for a value built around validation."""
    from events.store.errors import InvalidRow
    from events.types import StageMetricsReported, StageOutput, TurnCommitted

    events = [
        StageOutput(session_id="S", ts=1757000000.25, stage_id=0, request_id="r", text_delta="é [x]"),
        TurnCommitted(session_id="S", ts=1.5, turn_id=3),
        StageMetricsReported(session_id="S", ts=2.0, stage_id=1, request_id="r"),
        TurnCommitted(session_id="séance-ü-𝄞", ts=1757000000.000001, turn_id=0),  # non-ASCII stream id
        TurnCommitted(session_id="S", ts=3.0, turn_id=1, event_id="0f0e0d0c-0b0a-4908-8706-050403020100"),
        TurnCommitted.model_construct(session_id="S", ts=4.0, turn_id=2, event_id="not-a-uuid"),  # text id
    ]
    for event in events:
        one, two = NewRow.checked(event), NewRow.from_event(event).check()
        assert one == two and one.pieces == two.pieces and one.pieces is not None
        assert one.event_id == str(event.event_id)
        assert one.pieces == row_pieces(one.stream_id, one.event_id, one.type, 1, one.ts_us, one.data)
    bad = [
        TurnCommitted.model_construct(session_id="S", ts=-1.0, turn_id=0),  # ts before 1970
        TurnCommitted.model_construct(session_id="S\x00T", ts=1.0, turn_id=0),  # NUL in the stream id
        TurnCommitted.model_construct(session_id="S", ts=float("nan"), turn_id=0),
    ]
    for event in bad:
        with pytest.raises(InvalidRow) as one_error:
            NewRow.checked(event)
        with pytest.raises(InvalidRow) as two_error:
            NewRow.from_event(event).check()
        assert str(one_error.value) == str(two_error.value)


_TS = st.one_of(
    st.floats(min_value=0.0, max_value=253_402_300_799.0),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
)
_NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=0, max_value=2**70))


@settings(max_examples=300, deadline=None)
@given(ts=_TS, overlap=_NUMBER, response_id=st.text(max_size=12), fresh_id=st.booleans())
def test_checked_inline_steps_agree_with_the_functions_they_stand_for(
    ts: float | int, overlap: float | int, response_id: str, fresh_id: bool
) -> None:
    """NewRow.checked inlines ts_to_us, reads a fresh id's text from its slot and enters the
    NaN/inf refusal only for a payload holding a capital N or I (issue 23): for events built
    around validation with any ts, any number where a float goes, any text (spelling the
    tokens or not), it gives what from_event(...).check() gives, row or error."""
    from events.store.errors import InvalidRow
    from events.types import TurnCommitted

    event_id = new_event_id() if fresh_id else UUID("0f0e0d0c-0b0a-4908-8706-050403020100")
    event = TurnCommitted.model_construct(
        session_id="S", ts=ts, turn_id=0, event_id=event_id, response_id=response_id, overlap_speech_ms=overlap
    )
    try:
        one: NewRow | str = NewRow.checked(event)
    except InvalidRow as exc:
        one = str(exc)
    try:
        two: NewRow | str = NewRow.from_event(event).check()
    except InvalidRow as exc:
        two = str(exc)
    assert one == two
    if isinstance(one, NewRow) and isinstance(two, NewRow):
        assert one.pieces == two.pieces
        assert one.ts_us == ts_to_us(ts)
