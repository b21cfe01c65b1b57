"""The known tricks against a ledger file or database (issue 12), on both backends: the
database refuses what it can; ``verify`` (and ``verify --digest``) catches the rest and names
the first bad position and what is wrong. TAMPER_MATRIX in the README/design note is this file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from events import jsonl
from events.chain import GENESIS, hash_of
from events.chain_walk import Digest
from events.store import EventStore
from events.store.rows import StoredRow
from projections import projector as projector_module
from projections.shell import parallel, readmodels
from projections.shell.runner import ProjectionRunner
from reports import cli_verify
from reports.cli_verify import Verdict, head_digest, verify_store
from tests.histories import generate as generate_history

LOG = Path(__file__).parents[1] / "cases" / "logs" / "case-12-arrival.jsonl"  # 26 events, 2 leaks
CONTENT = "stream_id, version, event_id, type, schema_version, ts_us, recorded_at_us, data"


@pytest.fixture
async def ledger(db_url: str):
    store = await EventStore.open(db_url, create=True)
    try:
        await jsonl.import_rows(store, jsonl.parse_lines(LOG.read_text(encoding="utf-8").splitlines()))
        await ProjectionRunner(store, note=lambda _m: None).catch_up()
        yield store
    finally:
        await store.close()


async def sql(store: EventStore, *statements: str) -> None:
    async with store.recorder.backend.reader.begin() as conn:
        for statement in statements:
            await conn.execute(sa.text(statement))


def lift(store: EventStore, what: str) -> tuple[str, ...]:
    """Statements that take the append-only guard off (the owner of a PostgreSQL table, or
    anyone holding a SQLite file, can)."""
    if store.recorder.backend.name == "postgresql":
        return ("ALTER TABLE events DISABLE TRIGGER events_no_update_delete",)
    return (f"DROP TRIGGER events_no_{what}",)


async def verdict(store: EventStore, digest: Digest | None = None) -> Verdict:
    return await verify_store(store, digest)


async def test_an_untouched_ledger_verifies(ledger: EventStore) -> None:
    v = await verdict(ledger, (await head_digest(ledger))[0])
    assert (v.fault, v.mismatch, v.events, v.compared_at) == (None, None, 26, 26)


# ------------------------------------------------------------------ refused by the database
@pytest.mark.parametrize("trick", ["insert_or_replace", "replace_into", "update", "delete", "upsert"])
async def test_the_database_refuses(ledger: EventStore, trick: str) -> None:
    sqlite = ledger.recorder.backend.name == "sqlite"
    statements = {
        "insert_or_replace": f"INSERT OR REPLACE INTO events (position, {CONTENT}, hash) SELECT position, stream_id, "
        "version, event_id, type, schema_version, ts_us, recorded_at_us, '{}', hash "
        "FROM events WHERE position = 2",
        "replace_into": f"REPLACE INTO events (position, {CONTENT}) SELECT 99, stream_id, version + 100, event_id, "
        "type, schema_version, ts_us, recorded_at_us, data FROM events WHERE position = 3",
        "update": "UPDATE events SET data = '{}' WHERE position = 2",
        "delete": "DELETE FROM events WHERE position = 3",
        "upsert": f"INSERT INTO events (position, {CONTENT}) SELECT position, {CONTENT} FROM events "
        "WHERE position = 2 ON CONFLICT (position) DO UPDATE SET data = '{}'",
    }
    if not sqlite and trick in ("insert_or_replace", "replace_into"):
        pytest.skip("SQLite syntax (PostgreSQL's form is the upsert)")
    with pytest.raises(DBAPIError, match="append-only"):
        await sql(ledger, statements[trick])
    v = await verdict(ledger)
    assert (v.fault, v.mismatch, v.events) == (None, None, 26)


# ------------------------------------------------------------------ caught by verify
async def test_edit_after_lifting_the_guard(ledger: EventStore) -> None:
    await sql(
        ledger, *lift(ledger, "update"), "UPDATE events SET data = replace(data, '3200', '3201') WHERE position = 2"
    )
    v = await verdict(ledger)
    assert (v.fault.position, v.fault.kind) == (2, "edited"), v.fault


async def test_delete_in_the_middle(ledger: EventStore) -> None:
    await sql(ledger, *lift(ledger, "delete"), "DELETE FROM events WHERE position = 3")
    v = await verdict(ledger)
    assert (v.fault.position, v.fault.kind) == (3, "missing") and "3..3" in v.fault.detail


async def test_replace_around_the_trigger_drops_a_row(ledger: EventStore) -> None:
    """The issue's REPLACE INTO trick with the new insert trigger dropped too."""
    if ledger.recorder.backend.name != "sqlite":
        pytest.skip("SQLite only")
    await sql(
        ledger,
        "DROP TRIGGER events_no_replace",
        f"REPLACE INTO events (position, {CONTENT}) SELECT 99, stream_id, version + 100, event_id, type, "
        "schema_version, ts_us, recorded_at_us, data FROM events WHERE position = 3",
    )
    v = await verdict(ledger)
    assert (v.fault.position, v.fault.kind) == (3, "missing"), v.fault


async def test_swapped_rows(ledger: EventStore) -> None:
    rows = await _rows(ledger)
    r9, r10 = rows[8], rows[9]
    cols = ("stream_id", "version", "event_id", "type", "schema_version", "ts_us", "recorded_at_us", "data")
    assign = ", ".join(f"{c} = :{c}" for c in cols)
    async with ledger.recorder.backend.reader.begin() as conn:
        for statement in lift(ledger, "update"):
            await conn.execute(sa.text(statement))
        # park row 10 first: (stream, version) and event_id are unique
        await conn.execute(sa.text("UPDATE events SET event_id = 'parked', version = -1 WHERE position = 10"))
        for position, source in ((9, r10), (10, r9)):
            await conn.execute(
                sa.text(f"UPDATE events SET {assign} WHERE position = :p"),
                {"p": position, **{c: getattr(source, c) for c in cols}},
            )
    v = await verdict(ledger)
    assert (v.fault.position, v.fault.kind) == (9, "reordered"), v.fault


async def test_a_row_inserted_around_the_store(ledger: EventStore) -> None:
    await sql(
        ledger,
        f"INSERT INTO events (position, {CONTENT}) SELECT 27, stream_id, 999, 'forged', type, "
        "schema_version, ts_us, recorded_at_us, data FROM events WHERE position = 26",
    )
    v = await verdict(ledger)
    assert (v.fault.position, v.fault.kind) == (27, "inserted"), v.fault


async def test_truncated_tail_needs_the_digest(ledger: EventStore) -> None:
    digest, _ = await head_digest(ledger)
    await sql(
        ledger,
        *lift(ledger, "delete"),
        "DELETE FROM events WHERE position > 20",
        "DELETE FROM projection_checkpoints",
        "DELETE FROM rm_turn_tables",
        "DELETE FROM rm_audit_findings",
        "DELETE FROM rm_request_resources",
    )
    assert (await verdict(ledger)).fault is None  # a consistent, shorter chain
    v = await verdict(ledger, digest)
    assert (v.fault.position, v.fault.kind) == (21, "missing") and "truncated" in v.fault.detail


async def test_rewritten_and_rehashed_history_needs_the_digest(ledger: EventStore) -> None:
    digest, _ = await head_digest(ledger)
    rows = await _rows(ledger)
    previous, updates = GENESIS, []
    for row in rows:
        if row.position == 2:
            row = row._replace(data=row.data.replace("3200", "3201"))
        previous = hash_of(previous, row)
        updates.append((row.position, row.data, previous))
    async with ledger.recorder.backend.reader.begin() as conn:
        for statement in lift(ledger, "update"):
            await conn.execute(sa.text(statement))
        await conn.execute(
            sa.text("UPDATE events SET data = :d, hash = :h WHERE position = :p"),
            [{"p": p, "d": d, "h": h} for p, d, h in updates],
        )
    assert (await verdict(ledger)).fault is None
    v = await verdict(ledger, digest)
    assert (v.fault.position, v.fault.kind) == (26, "rewritten"), v.fault


async def test_an_edited_read_model_is_caught(ledger: EventStore) -> None:
    await sql(ledger, "DELETE FROM rm_audit_findings WHERE finding_no = 1")
    v = await verdict(ledger)
    assert v.fault is None and (v.mismatch.what, v.mismatch.key) == ("rm_audit_findings", "(1)"), v.mismatch
    await ProjectionRunner(ledger).rebuild()
    assert (await verdict(ledger)).mismatch is None


async def test_an_edited_turn_table_and_a_forged_checkpoint_are_caught(ledger: EventStore) -> None:
    assert await ledger.recorder.backend.run_read(readmodels.load_turns)
    await sql(ledger, "UPDATE rm_turn_tables SET request_id = 'forged'")
    v = await verdict(ledger)
    assert v.mismatch is not None and v.mismatch.what == "rm_turn_tables", v.mismatch
    await ProjectionRunner(ledger).rebuild()
    async with ledger.recorder.backend.reader.begin() as conn:
        await conn.execute(readmodels.checkpoints.update().values(state=b"\x93forged"))
    v = await verdict(ledger)
    assert v.mismatch is not None and v.mismatch.what == "checkpoint" and "refused" in v.mismatch.detail


async def _checkpoint_row(store: EventStore) -> dict:
    async with store.recorder.backend.reader.connect() as conn:
        return dict((await conn.execute(sa.select(readmodels.checkpoints))).one()._mapping)


async def _put_checkpoint(store: EventStore, **values: object) -> None:
    async with store.recorder.backend.reader.begin() as conn:
        await conn.execute(readmodels.checkpoints.update().values(**values))


@pytest.mark.parametrize("position", [1, 5, 9, 13, 17, 21, 25])
async def test_a_moved_checkpoint_is_named_as_the_checkpoint(ledger: EventStore, position: int) -> None:
    """Its row's position edited (generated): named as the checkpoint, not as the read-model
    rows that a fold at the new position disagrees with."""
    await _put_checkpoint(ledger, position=position)
    v = await verdict(ledger)
    assert v.fault is None and v.mismatch is not None and v.mismatch.what == "checkpoint", v.mismatch
    assert f"its row says position {position}, its state was sealed at position 26" in v.mismatch.detail


async def test_a_deleted_checkpoint_is_named_as_the_checkpoint(ledger: EventStore) -> None:
    await sql(ledger, "DELETE FROM projection_checkpoints")
    v = await verdict(ledger)
    assert (v.mismatch.what, v.mismatch.detail) == ("checkpoint", "missing while the read models hold rows (deleted)")


async def test_an_older_genuine_checkpoint_put_back_is_named_as_the_checkpoint(db_url: str) -> None:
    """The checkpoint the runner wrote at position 12, put back over the one at 26: its seal
    and log hash are genuine, but the read models hold rows from past position 12."""
    rows = jsonl.parse_lines(LOG.read_text(encoding="utf-8").splitlines())
    store = await EventStore.open(db_url, create=True)
    try:
        await jsonl.import_rows(store, rows[:12])
        await ProjectionRunner(store, note=pytest.fail).catch_up()
        old = await _checkpoint_row(store)
        await jsonl.import_rows(store, rows[12:])
        await ProjectionRunner(store, note=pytest.fail).catch_up()
        assert (await verdict(store)).intact
        await _put_checkpoint(store, position=old["position"], state=old["state"])
        v = await verdict(store)
        assert v.mismatch is not None and v.mismatch.what == "checkpoint", v.mismatch
        assert "at position 12, behind its read models" in v.mismatch.detail
    finally:
        await store.close()


def test_verify_names_a_tampered_checkpoint_as_the_checkpoint(tmp_path: Path) -> None:
    from tests.cli.conftest import Cli

    cli = Cli(f"sqlite+aiosqlite:///{tmp_path / 'l.db'}")
    for args in (("db", "upgrade"), ("events", "import", str(LOG)), ("rebuild",)):
        assert cli(*args).exit_code == 0
    import sqlite3

    conn = sqlite3.connect(tmp_path / "l.db")
    with conn:
        conn.execute("UPDATE projection_checkpoints SET position = 7")
    conn.close()
    r = cli("verify")
    assert r.exit_code == 1 and r.stdout.startswith("TAMPERED: checkpoint: moved"), r.output


async def _rows(store: EventStore) -> list[StoredRow]:
    return [r async for r in store.read_rows(1)]


async def test_no_false_checkpoint_difference_for_a_session_forgotten_then_given_a_late_event(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner checkpoints every 7 events while the fold forgets closed sessions every 5
    positions; the generated histories close sessions and then log their close's cancel and
    reopen them (late events of forgotten sessions). ``verify`` finds the checkpoint equal to
    one fresh fold (it used to report a checkpoint difference)."""
    monkeypatch.setattr(projector_module, "SWEEP_EVERY", 5)
    history = generate_history(random.Random(3), 3)
    store = await EventStore.open(db_url, create=True)
    try:
        await jsonl.import_rows(store, jsonl.parse_lines(history.log.jsonl().splitlines()))
        await ProjectionRunner(store, batch_size=7, note=pytest.fail).catch_up()
        v = await verdict(store)
        assert (v.fault, v.mismatch, v.compared_at) == (None, None, await store.head_position())
    finally:
        await store.close()


@pytest.mark.parametrize("in_range", [0, 1], ids=["in-the-workers-range", "in-this-process-range"])
async def test_the_parallel_check_of_a_large_sqlite_log(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, in_range: int
) -> None:
    """A SQLite log at or over PARALLEL_MIN_EVENTS is folded by partition processes (a worker
    and a thread here), each of which checks the chain links of one range of positions beside
    its fold; an intact log passes, and an edit in either range is still named by position and
    kind (the ordered walk names it)."""
    monkeypatch.setattr(parallel, "PARALLEL_MIN_EVENTS", 10)
    monkeypatch.setattr(parallel, "default_workers", lambda: 2)
    ranges: list[list[tuple[int, int]]] = []
    chain_ranges = parallel.chain_ranges

    def spied(*args):  # type: ignore[no-untyped-def]
        ranges.append(chain_ranges(*args))
        return ranges[-1]

    monkeypatch.setattr(parallel, "chain_ranges", spied)
    taken: list[int] = []
    original = cli_verify._walk_and_fold_in_parallel

    async def counted(*args):  # type: ignore[no-untyped-def]
        taken.append(1)
        return await original(*args)

    monkeypatch.setattr(cli_verify, "_walk_and_fold_in_parallel", counted)
    history = generate_history(random.Random(5), 3)  # three sessions: two partitions
    store = await EventStore.open(sqlite_url, create=True)
    try:
        await jsonl.import_rows(store, jsonl.parse_lines(history.log.jsonl().splitlines()))
        head = await store.head_position()
        until = head - 3
        await ProjectionRunner(store, batch_size=5, note=pytest.fail).catch_up(until_position=until)
        v = await verdict(store)
        assert (v.fault, v.mismatch, v.compared_at, v.events) == (None, None, until, head)
        digest = (await head_digest(store))[0]
        assert (v.head.hash, v.head.recorded_at_us) == (digest.hash, digest.recorded_at_us) and taken == [1]
        assert ranges == [[(1, head // 2), (head // 2 + 1, head)]]
        await sql(store, "DELETE FROM rm_audit_findings WHERE finding_no = 1")
        assert (await verdict(store)).mismatch.what == "rm_audit_findings"
        edited = ranges[0][in_range][0] + 2
        await sql(store, *lift(store, "update"), f"UPDATE events SET ts_us = ts_us + 1 WHERE position = {edited}")
        v = await verdict(store)
        assert (v.fault.position, v.fault.kind) == (edited, "edited"), v.fault
    finally:
        await store.close()
