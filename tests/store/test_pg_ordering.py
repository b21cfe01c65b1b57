"""PostgreSQL: allocation order = commit order, so a polling reader never skips a position."""

from __future__ import annotations

import asyncio

from events.store import EventStore
from events.store.planning import AppendCall
from events.store.rows import NewRow
from tests.store.helpers import turn, turns


async def test_late_commit_is_never_skipped(pg_url: str) -> None:
    store = await EventStore.open(pg_url, create=True)
    await store.append("S0", turns("S0", 3))
    seen: list[int] = []
    stop = asyncio.Event()

    async def poller() -> None:  # a naive subscriber: cursor = last seen position
        while not stop.is_set():
            rows = await store.recorder.select_rows((seen[-1] + 1) if seen else 1)
            seen.extend(r.position for r in rows)
            await asyncio.sleep(0.01)

    poll = asyncio.create_task(poller())
    slow = await store.recorder.backend.reader.connect()
    try:
        tx = await slow.begin()
        call = AppendCall([NewRow.from_event(turn("A", 0))], "A", 0)
        (outcome,) = await slow.run_sync(store.recorder.write_in, [call])
        assert outcome == [4]  # allocated, not committed (a plain call settles to its positions)

        fast = asyncio.create_task(store.append("B", [turn("B", 0)], expected_version=0))
        await asyncio.sleep(0.5)
        assert not fast.done(), "the second writer must wait for the first to commit"
        assert seen == [1, 2, 3]

        await tx.commit()
        assert await asyncio.wait_for(fast, 5) == [5]
        await asyncio.sleep(0.1)
    finally:
        stop.set()
        await poll
        await slow.close()
        await store.close()
    assert seen == [1, 2, 3, 4, 5]


async def test_rolled_back_allocation_leaves_no_gap(pg_url: str) -> None:
    store = await EventStore.open(pg_url, create=True)
    try:
        async with store.recorder.backend.reader.connect() as conn:
            tx = await conn.begin()
            call = AppendCall([NewRow.from_event(turn("A", 0))], "A", 0)
            await conn.run_sync(store.recorder.write_in, [call])
            await tx.rollback()
        assert await store.append("B", [turn("B", 0)]) == [1]
    finally:
        await store.close()
