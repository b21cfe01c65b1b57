"""CASE-08 part B: timestamps round-trip to the microsecond, in UTC, on both backends."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from events.store import EventStore
from events.types import ResponseEnded, TurnCommitted, ts_to_datetime


async def test_case08_part_b_round_trip(store: EventStore) -> None:
    whole = TurnCommitted(session_id="S2", ts="2025-09-04T15:33:40+00:00", turn_id=0, response_id="resp-2")
    frac = ResponseEnded(
        session_id="S2", ts="2025-09-04T15:33:40.850001+00:00", response_id="resp-2", status="completed"
    )
    shifted = TurnCommitted(session_id="S2b", ts="2025-09-04T23:33:40+08:00", turn_id=0, response_id="resp-2")
    await store.append("S2", [whole, frac])
    await store.append("S2b", [shifted])

    s2 = await store.read_stream("S2")
    (s2b,) = await store.read_stream("S2b")
    assert ts_to_datetime(s2[0].ts) == datetime(2025, 9, 4, 15, 33, 40, tzinfo=UTC)
    assert ts_to_datetime(s2[1].ts) == datetime(2025, 9, 4, 15, 33, 40, 850001, tzinfo=UTC)
    assert ts_to_datetime(s2b.ts).isoformat() == "2025-09-04T15:33:40+00:00"
    assert s2[0].ts == 1757000020.0 and s2[1].ts == 1757000020.850001 and s2b.ts == 1757000020.0
    e2e_ms = (s2[1].ts - s2[0].ts) * 1000
    assert abs(e2e_ms - 850.001) < 1e-3

    # the column itself holds exact integer microseconds
    async with store.recorder.backend.reader.connect() as conn:
        stored = (await conn.execute(sa.text("SELECT ts_us FROM events ORDER BY position"))).scalars().all()
    assert stored == [1757000020000000, 1757000020850001, 1757000020000000]


async def test_microseconds_survive_at_epoch_scale(store: EventStore) -> None:
    values = [1757000020.000001, 1757000020.999999, 1757000020.5, 0.000001, 4102444800.123456]
    await store.append("T", [TurnCommitted(session_id="T", ts=v, turn_id=i) for i, v in enumerate(values)])
    assert [s.ts for s in await store.read_stream("T")] == values
