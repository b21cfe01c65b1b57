"""The database itself refuses UPDATE and DELETE on events (both backends)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from events.store import EventStore
from tests.store.helpers import turns


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE events SET data = '{}' WHERE position = 1",
        "UPDATE events SET stream_id = 'X'",
        "DELETE FROM events WHERE position = 1",
        "DELETE FROM events",
    ],
)
async def test_raw_update_and_delete_are_refused(store: EventStore, sql: str) -> None:
    await store.append("S1", turns("S1", 2))
    engine = store.recorder.backend.reader
    with pytest.raises(DBAPIError, match="append-only"):
        async with engine.begin() as conn:
            await conn.execute(sa.text(sql))
    assert [s.event.turn_id for s in await store.read_stream("S1")] == [0, 1]
    assert await store.head_position() == 2


async def test_truncate_refused_on_postgres(pg_url: str) -> None:
    store = await EventStore.open(pg_url, create=True)
    try:
        await store.append("S1", turns("S1", 1))
        with pytest.raises(DBAPIError, match="append-only"):
            async with store.recorder.backend.reader.begin() as conn:
                await conn.execute(sa.text("TRUNCATE events"))
        assert await store.head_position() == 1
    finally:
        await store.close()
