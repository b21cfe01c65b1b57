"""Acknowledged means durable (issue 22): every SQLite connection the ledger writes through runs
``synchronous=FULL`` unless NORMAL is asked for (the URL's ``?synchronous=NORMAL`` or the
``synchronous`` argument). ``PRAGMA synchronous`` is read back on the connections themselves:
2 is FULL, 1 is NORMAL."""

from __future__ import annotations

import pytest

from engine_bridge.engine import SessionEngine
from events.store import EventStore
from events.store.backends import make_backend
from tests.fakes.fake_port import FakeStagePort

FULL, NORMAL = 2, 1


def _pragma(conn) -> int:  # type: ignore[no-untyped-def]
    return int(conn.exec_driver_sql("PRAGMA synchronous").scalar())


async def _levels(store: EventStore) -> tuple[int, int]:
    """(the append writer's level, a reader's level)."""
    backend = store.recorder.backend
    return await backend.run_write(_pragma), await backend.run_read(_pragma)


@pytest.mark.parametrize(
    ("query", "argument", "expected"),
    [
        ("", None, FULL),
        ("?synchronous=NORMAL", None, NORMAL),
        ("?synchronous=normal", None, NORMAL),
        ("?synchronous=FULL", None, FULL),
        ("", "NORMAL", NORMAL),
        ("?synchronous=NORMAL", "FULL", FULL),  # the argument wins over the URL
    ],
)
async def test_store_writer_and_readers(tmp_path, query: str, argument: str | None, expected: int) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}{query}"
    store = await EventStore.open(url, create=True, synchronous=argument)  # type: ignore[arg-type]
    try:
        assert await _levels(store) == (expected, expected)
    finally:
        await store.close()
    assert (tmp_path / "ledger.db").exists() and not list(tmp_path.glob("*synchronous*"))


@pytest.mark.parametrize(("query", "expected"), [("", FULL), ("?synchronous=NORMAL", NORMAL)])
async def test_session_engine(tmp_path, query: str, expected: int) -> None:
    """The engine used to open its ledger at NORMAL whatever the README said."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'engine.db'}{query}"
    engine = await SessionEngine.open(url, [FakeStagePort(0, "thinker"), FakeStagePort(1, "talker")])
    try:
        assert await _levels(engine.store) == (expected, expected)
    finally:
        await engine.aclose()


@pytest.mark.parametrize(("query", "expected"), [("", FULL), ("?synchronous=NORMAL", NORMAL)])
async def test_migration_writer(tmp_path, query: str, expected: int) -> None:
    """The backend ``db upgrade``/``downgrade`` write through (events.store.migrate)."""
    backend = make_backend(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}{query}")
    try:
        assert await backend.run_write(_pragma) == expected
    finally:
        await backend.dispose()


@pytest.mark.parametrize("query", ["?synchronous=OFF", "?synchronous=FULL&synchronous=NORMAL", "?journal_mode=DELETE"])
async def test_other_levels_and_parameters_are_refused(tmp_path, query: str) -> None:
    with pytest.raises(ValueError, match="synchronous|query parameter"):
        await EventStore.open(f"sqlite+aiosqlite:///{tmp_path / 'x.db'}{query}", create=True)
    assert not (tmp_path / "x.db").exists()
