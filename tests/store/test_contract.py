"""Contract of EventStore, run on both backends (``db_url`` is parametrised)."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from events.records import EventRecord
from events.store import ConcurrencyError, EventIdConflict, EventStore, ImportRow, StoreClosed
from events.structs import struct_of, struct_type
from events.types import StageRequestSubmitted, TurnCommitted
from tests.store.helpers import turn, turns
from tests.waiting import eventually


async def test_append_assigns_positions_and_versions(store: EventStore) -> None:
    assert await store.head_position() == 0
    assert await store.append("S1", turns("S1", 3), expected_version=0) == [1, 2, 3]
    assert await store.append("S2", turns("S2", 1), expected_version=0) == [4]
    assert await store.append("S1", turns("S1", 2, start=3), expected_version=3) == [5, 6]
    stream = await store.read_stream("S1")
    assert [(e.position, e.version) for e in stream] == [(1, 1), (2, 2), (3, 3), (5, 4), (6, 5)]
    assert [e.event.turn_id for e in stream] == [0, 1, 2, 3, 4]
    assert await store.head_position() == 6
    assert await store.read_stream("nobody") == []
    assert [e.version for e in await store.read_stream("S1", from_version=4)] == [4, 5]


async def test_read_back_equals_written(store: EventStore) -> None:
    written = turns("S1", 2)
    await store.append("S1", written)
    got = [s.event for s in await store.read_stream("S1")]
    assert got == [struct_of(e) for e in written]  # read back as each event's struct
    assert all(s.recorded_at > 1.6e9 for s in await store.read_stream("S1"))


async def test_expected_version_mismatch_raises_typed_error(store: EventStore) -> None:
    await store.append("S1", turns("S1", 2), expected_version=0)
    with pytest.raises(ConcurrencyError) as err:
        await store.append("S1", [turn("S1", 9)], expected_version=1)
    assert (err.value.stream_id, err.value.expected, err.value.actual) == ("S1", 1, 2)
    with pytest.raises(ConcurrencyError) as err:
        await store.append("S1", [turn("S1", 9)], expected_version=0)
    assert err.value.actual == 2
    with pytest.raises(ConcurrencyError):
        await store.append("S3", [turn("S3", 1)], expected_version=4)
    assert len(await store.read_stream("S1")) == 2
    assert await store.head_position() == 2


async def test_append_at_end_without_check(store: EventStore) -> None:
    await store.append("S1", turns("S1", 2), expected_version=None)
    await store.append("S1", turns("S1", 1, start=2), expected_version=None)
    assert [e.version for e in await store.read_stream("S1")] == [1, 2, 3]


async def test_reappend_same_ids_is_idempotent(store: EventStore) -> None:
    batch = turns("S1", 3)
    first = await store.append("S1", batch, expected_version=0)
    await store.append("S1", [turn("S1", 7)], expected_version=3)
    # a retry after a lost acknowledgement: stale expected version, same ids
    again = await store.append("S1", batch, expected_version=0)
    assert again == first
    assert len(await store.read_stream("S1")) == 4
    assert await store.head_position() == 4


async def test_resent_ids_in_a_group_commit_return_their_positions_and_spare_neighbours(store: EventStore) -> None:
    """The writer plans without looking ids up; a re-sent stored id (no version check, or a
    stale one) is caught and the batch planned again — each call still gets its own answer."""
    batch = turns("S1", 2)
    first = await store.append("S1", batch)
    outcomes = await asyncio.gather(
        store.append("S1", batch),
        store.append("S2", turns("S2", 1)),
        store.append("S1", batch, expected_version=0),
        store.append("S1", [batch[0], turn("S1", 9)]),
        store.append("S3", turns("S3", 2), expected_version=0),
        return_exceptions=True,
    )
    assert outcomes[0] == outcomes[2] == first
    assert isinstance(outcomes[3], EventIdConflict)
    assert len(outcomes[1]) == 1 and len(outcomes[4]) == 2  # type: ignore[arg-type]
    assert await store.head_position() == 5
    assert [e.version for e in await store.read_stream("S3")] == [1, 2]


async def test_streams_continue_from_the_log_after_a_batch_planned_again(store: EventStore) -> None:
    """The writer plans on its version cache in place: a batch the database refuses (a re-sent
    stored id without a version check, planned as new) is planned again from the stored
    versions, and nothing its first plan allotted survives into later appends."""
    batch = turns("S1", 2)
    await store.append("S1", batch)
    again, other = await asyncio.gather(store.append("S1", batch), store.append("S2", turns("S2", 1)))
    assert again == [1, 2] and other == [3]
    assert await store.append("S1", [turn("S1", 5)], expected_version=2) == [4]
    assert await store.append("S2", [turn("S2", 6)], expected_version=1) == [5]
    assert [e.version for e in await store.read_stream("S2")] == [1, 2]


async def test_partial_reappend_is_refused(store: EventStore) -> None:
    batch = turns("S1", 2)
    await store.append("S1", batch)
    with pytest.raises(EventIdConflict) as err:
        await store.append("S1", [batch[0], turn("S1", 5)])
    assert err.value.event_ids == [str(batch[0].event_id)]
    assert await store.head_position() == 2


async def test_event_id_of_another_stream_is_refused(store: EventStore) -> None:
    e = turn("S1", 0)
    await store.append("S1", [e])
    moved = TurnCommitted(session_id="S2", ts=e.ts, turn_id=0, event_id=e.event_id)
    with pytest.raises(EventIdConflict, match="another stream"):
        await store.append("S2", [moved])


async def test_bad_calls_raise_value_error(store: EventStore) -> None:
    with pytest.raises(ValueError, match="no events"):
        await store.append("S1", [])
    with pytest.raises(ValueError, match="session_id 'S2'"):
        await store.append("S1", [turn("S2", 0)])
    e = turn("S1", 0)
    with pytest.raises(ValueError, match="twice"):
        await store.append("S1", [e, e])
    with pytest.raises(ValueError, match="expected_version"):
        await store.append("S1", [e], expected_version=-1)
    assert await store.head_position() == 0


async def test_one_bad_call_does_not_fail_its_batch(store: EventStore) -> None:
    """Concurrent calls share one transaction; only the conflicting one fails."""
    await store.append("S0", turns("S0", 1), expected_version=0)
    calls = [store.append(f"S{i}", [turn(f"S{i}", 1)], expected_version=0) for i in range(1, 20)]
    calls.append(store.append("S0", [turn("S0", 1)], expected_version=0))  # wrong: S0 is at 1
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[-1], ConcurrencyError)
    assert all(isinstance(r, list) and len(r) == 1 for r in results[:-1])
    assert sorted(r[0] for r in results[:-1]) == list(range(2, 21))


async def test_read_all_ranges_and_batches(store: EventStore) -> None:
    for i in range(5):
        await store.append(f"S{i}", turns(f"S{i}", 5))
    everything = [s.position async for s in store.read_all(batch_size=3)]
    assert everything == list(range(1, 26))
    assert [s.position async for s in store.read_all(from_position=24)] == [24, 25]
    assert [s.position async for s in store.read_all(5, until_position=8, batch_size=2)] == [5, 6, 7, 8]
    assert [s.position async for s in store.read_all(from_position=26)] == []
    rows = [r async for r in store.read_rows(stream_id="S2", batch_size=2)]
    assert [r.position for r in rows] == [11, 12, 13, 14, 15]
    event = rows[0].decode().event
    assert json.loads(rows[0].data) == {
        k: v
        for k, v in msgspec.to_builtins(event).items()
        if k not in ("type", "event_id", "session_id", "ts", "schema_version")
    }


async def test_sqlite_raw_row_read_equals_the_core_select(store: EventStore) -> None:
    """The SQLite backend reads rows on the driver directly (no SQLAlchemy result rows): same
    rows, types and bounds as the Core select the other backend runs."""
    for i in range(3):
        await store.append(f"S{i}", turns(f"S{i}", 4))
    raw = store.recorder.backend.select_rows_raw
    if store.backend_name != "sqlite":
        assert raw is None
        return
    assert raw is not None
    cases = [(1, None, 100, None), (3, 9, 4, None), (2, None, 100, "S1"), (5, 11, 2, "S1"), (13, None, 5, None)]
    for case in cases:
        store.recorder.backend.select_rows_raw = None
        try:
            core = await store.recorder.select_rows(case[0], until_position=case[1], limit=case[2], stream_id=case[3])
        finally:
            store.recorder.backend.select_rows_raw = raw
        fast = await store.recorder.select_rows(case[0], until_position=case[1], limit=case[2], stream_id=case[3])
        assert fast == core and [tuple(map(type, r)) for r in fast] == [tuple(map(type, r)) for r in core], case
    assert [r.position for r in await store.recorder.select_rows(5, until_position=11, limit=2, stream_id="S1")] == [
        5,
        6,
    ]


async def test_subscribe_catches_up_then_follows(store: EventStore) -> None:
    await store.append("S1", turns("S1", 3))
    seen: list[int] = []

    async def consume() -> None:
        async for stored in store.subscribe(from_position=2, poll_interval=5.0):
            seen.append(stored.position)
            if len(seen) == 4:
                return

    task = asyncio.create_task(consume())
    await eventually(lambda: len(seen) >= 2)  # caught up, however slowly
    assert seen == [2, 3]
    await store.append("S1", turns("S1", 2, start=3))
    await asyncio.wait_for(task, 2.0)  # woken by the commit, not by the 5 s poll
    assert seen == [2, 3, 4, 5]


async def test_subscribe_sees_other_store_commits(db_url: str) -> None:
    a = await EventStore.open(db_url, create=True)
    b = await EventStore.open(db_url)
    try:
        it = a.subscribe(poll_interval=0.05).__aiter__()
        await b.append("S1", turns("S1", 1))
        first = await asyncio.wait_for(it.__anext__(), 2.0)
        assert first.position == 1
        await it.aclose()
    finally:
        await a.close()
        await b.close()


async def test_subscribe_is_cancellable(store: EventStore) -> None:
    async def consume() -> None:
        async for _ in store.subscribe():
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.append("S1", turns("S1", 1)) == [1]  # store still usable


async def test_append_records_bulk_is_idempotent_and_checks_versions(store: EventStore) -> None:
    from events.records import to_record

    events_ = turns("A", 2) + turns("B", 1) + turns("A", 1, start=2)
    rows = [ImportRow.from_event(e) for e in events_[:2]] + [ImportRow(to_record(e)) for e in events_[2:]]
    result = await store.append_records(rows)
    assert result.positions == [1, 2, 3, 4] and result.appended == 4 and result.skipped == 0
    assert [e.version for e in await store.read_stream("A")] == [1, 2, 3]
    again = await store.append_records(rows + [ImportRow(to_record(turn("B", 5)))])
    assert again.positions == [1, 2, 3, 4, 5] and again.appended == 1
    with pytest.raises(ConcurrencyError) as err:
        await store.append_records([ImportRow(to_record(turn("A", 9)), version=2)])
    assert (err.value.expected, err.value.actual) == (1, 3)
    assert await store.head_position() == 5


async def test_append_records_keeps_recorded_at(store: EventStore) -> None:
    from events.records import to_record

    await store.append_records([ImportRow(to_record(turn("A", 0)), recorded_at_us=1_700_000_000_123_456)])
    (stored,) = await store.read_stream("A")
    assert stored.recorded_at == 1_700_000_000.123456


async def test_old_schema_row_reads_as_current_model(store: EventStore) -> None:
    """A real v1 StageRequestSubmitted row (``tokens_in``) is upcast on read."""
    record = EventRecord(
        stream_id="S1",
        event_id=__import__("uuid").uuid4(),
        type="StageRequestSubmitted",
        schema_version=1,
        ts_us=1_757_000_000_000_001,
        data={"stage_id": 0, "request_id": "duplex-s.UzE.i.0.e.0.r.stage0_t0", "tokens_in": 17},
    )
    await store.append_records([ImportRow(record)])
    (stored,) = await store.read_stream("S1")
    assert type(stored.event) is struct_type(StageRequestSubmitted)
    assert stored.event.num_tokens_in == 17 and stored.event.schema_version == 2
    (raw,) = [r async for r in store.read_rows()]
    assert raw.schema_version == 1 and "tokens_in" in raw.data


async def test_closed_store_refuses_appends(db_url: str) -> None:
    s = await EventStore.open(db_url, create=True)
    await s.append("S1", turns("S1", 1))
    await s.close()
    with pytest.raises(StoreClosed):
        await s.append("S1", turns("S1", 1, start=1))
    reopened = await EventStore.open(db_url)
    assert await reopened.head_position() == 1
    await reopened.close()
