"""One bad append in a group commit fails only its own caller, with a typed error; the
others commit (issue 11 point 2). SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from events.store import AppendFailed, EventStore, InvalidRow, StoreError
from events.store.planning import AppendCall
from events.store.rows import NewRow
from events.types import SessionOpened


def opened(stream: str, ts: float = 1757000000.0) -> SessionOpened:
    return SessionOpened(session_id=stream, ts=ts)


async def _neighbours_and(store: EventStore, bad: asyncio.Future | object) -> list[object]:
    """Ten valid appends queued in the same group commit as ``bad`` (an awaitable)."""
    good = [store.append(f"G{i}", [opened(f"G{i}")], expected_version=0) for i in range(10)]
    return await asyncio.gather(*good[:5], bad, *good[5:], return_exceptions=True)  # type: ignore[arg-type]


async def _assert_neighbours_committed(store: EventStore, results: list[object]) -> None:
    good = results[:5] + results[6:]
    assert all(isinstance(r, list) and len(r) == 1 for r in good), good
    assert isinstance(results[5], StoreError), results[5]
    assert await store.head_position() == 10
    assert sorted([p for r in good for p in r]) == list(range(1, 11))  # type: ignore[union-attr]
    for i in range(10):
        assert await store.stream_version(f"G{i}") == 1


@pytest.mark.parametrize("ts", [1e13, -0.5, float("nan")])
async def test_a_poison_ts_is_refused_before_the_batch(store: EventStore, ts: float) -> None:
    bad = store.append("B", [SessionOpened.model_construct(session_id="B", ts=ts, event_id=opened("B").event_id)])
    results = await _neighbours_and(store, bad)
    assert isinstance(results[5], InvalidRow) and isinstance(results[5], ValueError)
    await _assert_neighbours_committed(store, results)


async def test_a_nul_in_the_stream_id_is_refused_before_the_batch(store: EventStore) -> None:
    event = SessionOpened.model_construct(session_id="B\x00C", ts=1.0, event_id=opened("x").event_id)
    results = await _neighbours_and(store, store.append("B\x00C", [event]))
    assert isinstance(results[5], InvalidRow)
    await _assert_neighbours_committed(store, results)


async def test_a_row_the_database_refuses_fails_alone(store: EventStore) -> None:
    """Past every check (a hand-made call straight to the writer): the database refuses the
    row (an integer beyond 64 bits); the batch is retried without it."""
    row = NewRow("B", "00000000-0000-4000-8000-0000000000bb", "SessionOpened", 1, 10**20, "{}")
    bad = store._writer.submit(AppendCall([row], "B", None))
    results = await _neighbours_and(store, bad)
    assert isinstance(results[5], AppendFailed), results[5]
    assert "\n" not in str(results[5]) and len(str(results[5])) < 500
    await _assert_neighbours_committed(store, results)
    assert await store.stream_version("B") == 0


async def test_postgres_refusing_a_nul_stream_fails_only_that_call(pg_url: str) -> None:
    """The issue's PostgreSQL case, past the checks: text with NUL is refused by the server."""
    store = await EventStore.open(pg_url, create=True)
    try:
        row = NewRow("B\x00C", "00000000-0000-4000-8000-0000000000cc", "SessionOpened", 1, 1, "{}")
        results = await _neighbours_and(store, store._writer.submit(AppendCall([row], "B\x00C", None)))
        assert isinstance(results[5], AppendFailed), results[5]
        await _assert_neighbours_committed(store, results)
    finally:
        await store.close()
