"""The write of a parallel rebuild: SQLite copies the partitions' spooled turn rows itself
(``readmodels.insert_spooled``, the spool files attached to the write connection), in the
transaction of the checkpoint; the files are detached after it whether it committed or not."""

from __future__ import annotations

import pytest

from projections.shell import readmodels
from projections.shell.runner import ProjectionRunner
from tests.projections.test_parallel_rebuild import EVENTS, _dump, _rebuild, _store


async def _attached(store) -> list[str]:
    rows = await store.run_write(lambda conn: conn.exec_driver_sql("PRAGMA database_list").fetchall())
    return [schema for _, schema, _ in rows]


async def test_a_failed_rebuild_write_leaves_nothing_attached_and_the_next_one_succeeds(tmp_path) -> None:
    store = await _store(tmp_path / "l.db", EVENTS)
    try:
        sequential, _ = await _rebuild(store, 1)
        runner = ProjectionRunner(store, batch_size=500)

        def fail() -> None:
            raise RuntimeError("injected before the checkpoint")

        runner.before_checkpoint = fail
        with pytest.raises(RuntimeError, match="injected"):
            await runner.rebuild(workers=2)
        assert await _attached(store) == ["main"]
        left = await store.recorder.backend.run_read(_dump)
        assert left["rm_turn_tables"] == [] and left["checkpoint"] == []  # the rows rolled back with it
        for _ in range(2):  # and twice in a row: each write finds no spool of the one before
            assert (await _rebuild(store, 2))[0] == sequential
            assert await _attached(store) == ["main"]
    finally:
        await store.close()


async def test_rows_of_a_spool_keep_the_first_of_a_key(tmp_path) -> None:
    """A key twice in the spools (a response id reused beyond what the fold remembers): the
    first row in spool order is kept, as the per-row insert keeps it."""
    import sqlite3

    store = await _store(tmp_path / "l.db", EVENTS[:1])
    spools = []
    for i, text in enumerate(("first", "second")):
        path = tmp_path / f"turns-{i}.db"
        spool = sqlite3.connect(path)
        spool.execute(f"CREATE TABLE turns ({', '.join(readmodels.TURN_COLUMNS)})")
        spool.execute(
            f"INSERT INTO turns VALUES ({', '.join('?' * len(readmodels.TURN_COLUMNS))})",
            ("s1", "resp-1", "", 0, "stop", 1, 2, 3, text),
        )
        spool.commit()
        spool.close()
        spools.append(str(path))
    try:
        await store.run_write(readmodels.insert_spooled, spools)
        await store.run_write(readmodels.detach_spooled)
        rows = (await store.recorder.backend.run_read(_dump))["rm_turn_tables"]
        assert [r[-1] for r in rows] == ["first"]
        assert await _attached(store) == ["main"]
    finally:
        await store.close()


async def test_a_merge_that_fails_rolls_the_rows_back_and_frees_the_write_thread(tmp_path, monkeypatch) -> None:
    """The rows are copied on the write thread while the state is merged here: a merge error
    reaches the waiting write, which rolls back (no row, no checkpoint), and the store writes on."""
    import asyncio

    store = await _store(tmp_path / "l.db", EVENTS)
    try:
        sequential, _ = await _rebuild(store, 1)

        def broken(self, projector, sessions):  # type: ignore[no-untyped-def]
            raise RuntimeError("injected in the merge")

        monkeypatch.setattr(ProjectionRunner, "_snapshot", broken)
        with pytest.raises(RuntimeError, match="injected in the merge"):
            await asyncio.wait_for(ProjectionRunner(store, batch_size=500).rebuild(workers=2), 120)
        left = await store.recorder.backend.run_read(_dump)
        assert left["rm_turn_tables"] == [] and left["checkpoint"] == []
        assert await _attached(store) == ["main"]
        monkeypatch.undo()
        assert (await _rebuild(store, 2))[0] == sequential
    finally:
        await store.close()


async def test_a_rebuild_that_races_another_writes_its_own_rows_whole(tmp_path, monkeypatch) -> None:
    """Two ``rebuild`` s of one ledger at once (a second process, or ``serve`` catching up):
    the other's rows land between this rebuild's early delete and its write. The write
    transaction clears again before it inserts, so it succeeds (no ``UNIQUE constraint
    failed``) and leaves exactly a sequential rebuild's rows and checkpoint."""
    from projections.shell import partitions

    store = await _store(tmp_path / "l.db", EVENTS)
    try:
        expected, _ = await _rebuild(store, 1)
        fold = partitions.fold_partitions

        async def raced(*args, **kwargs):  # type: ignore[no-untyped-def]
            found = await fold(*args, **kwargs)
            await _rebuild(store, 1)  # the other writer's whole rebuild, committed meanwhile
            return found

        monkeypatch.setattr(partitions, "fold_partitions", raced)
        assert (await _rebuild(store, 2))[0] == expected
    finally:
        await store.close()
