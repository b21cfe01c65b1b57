"""CASE-14: concurrent appends — exactly one winner, no silent loss, no `database is locked`."""

from __future__ import annotations

import asyncio

import pytest

from events.store import ConcurrencyError, EventStore
from events.types import AbortRequested
from tests.store.helpers import begun, turns


async def _retry_once(store: EventStore, stream: str, event, expected: int) -> tuple[str, list[int]]:
    try:
        return "won", await store.append(stream, [event], expected_version=expected)
    except ConcurrencyError as exc:
        assert (exc.stream_id, exc.expected, exc.actual) == (stream, expected, expected + 1)
        current = len(await store.read_stream(stream))
        return "retried", await store.append(stream, [event], expected_version=current)


@pytest.mark.parametrize("reps", [200])
async def test_part_a_same_expected_version_exactly_one_wins(store: EventStore, reps: int) -> None:
    for rep in range(reps):
        stream = f"S1-{rep}"
        await store.append(stream, turns(stream, 7), expected_version=0)
        a = begun(stream, "resp-3", ts=120.010)
        b = AbortRequested(session_id=stream, ts=120.011, request_ids=["duplex-s.UzE.i.0.e.0.r.stage0_t2"])
        (ra, pa), (rb, pb) = await asyncio.gather(_retry_once(store, stream, a, 7), _retry_once(store, stream, b, 7))
        assert sorted([ra, rb]) == ["retried", "won"]
        stored = await store.read_stream(stream)
        assert [s.version for s in stored] == list(range(1, 10))
        ids = [s.event.event_id for s in stored]  # the stored text
        assert ids.count(str(a.event_id)) == 1 and ids.count(str(b.event_id)) == 1
        winner_pos, loser_pos = (pa[0], pb[0]) if ra == "won" else (pb[0], pa[0])
        assert winner_pos < loser_pos
        versions = {s.event.event_id: s.version for s in stored}
        assert versions[str((a if ra == "won" else b).event_id)] == 8


async def test_part_b_five_sessions_sequential_appends(store: EventStore) -> None:
    async def session(i: int) -> None:
        for k in range(10):
            await store.append(f"S{i}", turns(f"S{i}", 1, start=k), expected_version=k)

    await asyncio.gather(*(session(i) for i in range(1, 6)))
    positions = []
    for i in range(1, 6):
        stored = await store.read_stream(f"S{i}")
        assert [s.version for s in stored] == list(range(1, 11))
        positions += [s.position for s in stored]
    assert sorted(positions) == list(range(1, 51))


async def test_part_c_append_at_end_same_stream(store: EventStore) -> None:
    async def writer(start: int) -> None:
        for k in range(20):
            await store.append("S6", turns("S6", 1, start=start + k))

    await asyncio.gather(writer(0), writer(100))
    stored = await store.read_stream("S6")
    assert [s.version for s in stored] == list(range(1, 41))
    assert len({s.event.event_id for s in stored}) == 40


async def test_32_writers_lose_nothing(store: EventStore) -> None:
    async def session(i: int) -> None:
        for k in range(25):
            await store.append(f"W{i}", turns(f"W{i}", 2, start=2 * k), expected_version=2 * k)

    await asyncio.gather(*(session(i) for i in range(32)))
    assert await store.head_position() == 32 * 50
    assert [s.position async for s in store.read_all()] == list(range(1, 1601))
    for i in (0, 17, 31):
        assert [s.version for s in await store.read_stream(f"W{i}")] == list(range(1, 51))
