"""Every edit of a ledger file is named as tampering, with its position (issue 22).

Each edit is forged on a real SQLite ledger with the ``sqlite3`` module, as an owner of the file
would: the guard trigger is lifted and put back around it. Generated over the kinds of edit:

* a value's storage type changed (``typeof``: BLOB data, REAL timestamp, TEXT version, text
  hash, a text column that is not UTF-8…) — ``verify``/``digest`` exit 1 naming the position,
  never exit 2 with a Python message; every reader says ``TAMPERED … position N`` first;
* an event's data edited into a value its model refuses — every reader's first line is
  ``TAMPERED … position N``, then the validation error, exit 1; ``events export`` too;
* an index of ``events`` pointed at a forged b-tree (``PRAGMA writable_schema``) that hides a
  session — ``verify``/``digest`` name the structure at the first disagreeing position, and
  readers looking the session up say ``TAMPERED`` first instead of "no session";
* ``sqlite_stat1`` rows in a shape ``ANALYZE`` never writes — refused as tampering by
  ``verify``/``digest`` (exit 1, nothing of the file run), by every other command (exit 2);
  ``ANALYZE``'s own rows are accepted.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from events.store.sqlite_schema import SQLITE_TRIGGERS
from tests.cases.logbook import LOG_DIR
from tests.cli.conftest import Cli

LOG = LOG_DIR / "case-13-reasons.jsonl"  # 50 events, sessions S1..S3


@pytest.fixture(scope="module")
def clean_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clean") / "ledger.db"
    result = Cli(f"sqlite+aiosqlite:///{path}")("events", "import", str(LOG))
    assert result.exit_code == 0, result.output
    return path


def _copy(clean_file: Path, tmp_path: Path) -> tuple[Cli, Path]:
    path = tmp_path / "ledger.db"
    shutil.copy(clean_file, path)
    return Cli(f"sqlite+aiosqlite:///{path}"), path


def _edit(path: Path, statement: str) -> None:
    """Run ``statement`` on the events table with the UPDATE guard lifted, then put it back."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("DROP TRIGGER events_no_update")
        conn.execute(statement)
        conn.execute(SQLITE_TRIGGERS["events_no_update"])
        conn.commit()
    finally:
        conn.close()


def _first_stderr(result) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("note: ")]
    return lines[0] if lines else ""


RETYPED = {
    "data-blob": ("UPDATE events SET data = CAST(data AS BLOB) WHERE position = 3", 3, "data holds blob"),
    "data-not-utf8": ("UPDATE events SET data = CAST(x'7b22ff227d' AS TEXT) WHERE position = 4", 4, "not UTF-8"),
    "ts-real": ("UPDATE events SET ts_us = ts_us + 0.5 WHERE position = 5", 5, "ts_us holds real"),
    "recorded-real": ("UPDATE events SET recorded_at_us = 1e300 WHERE position = 6", 6, "recorded_at_us holds real"),
    "version-text": ("UPDATE events SET version = 'v' || version WHERE position = 7", 7, "version holds text"),
    "schema-version-text": (
        "UPDATE events SET schema_version = 'one' WHERE position = 8",
        8,
        "schema_version holds text",
    ),
    "stream-blob": (
        "UPDATE events SET stream_id = CAST(stream_id AS BLOB) WHERE position = 9",
        9,
        "stream_id holds blob",
    ),
    "type-blob": ("UPDATE events SET type = CAST(type AS BLOB) WHERE position = 10", 10, "type holds blob"),
    "event-id-blob": ("UPDATE events SET event_id = randomblob(16) WHERE position = 11", 11, "event_id holds blob"),
    "hash-text": ("UPDATE events SET hash = hex(hash) WHERE position = 12", 12, "hash holds text"),
}
READERS: dict[str, tuple[str, ...]] = {
    "audit": ("audit",),
    "tables": ("tables",),
    "metrics": ("metrics",),
    "timeline": ("timeline", "--session", "S1"),
    "export": ("events", "export"),
}


@pytest.mark.parametrize("kind", sorted(RETYPED))
def test_a_retyped_value_is_an_edit_named_at_its_position(clean_file: Path, tmp_path: Path, kind: str) -> None:
    cli, path = _copy(clean_file, tmp_path)
    statement, position, said = RETYPED[kind]
    _edit(path, statement)
    for command in ("verify", "digest"):
        r = cli(command)
        assert r.exit_code == 1, (command, r.output)
        first = r.stdout.splitlines()[0]
        assert first.startswith(f"TAMPERED: log position {position}: edited"), (command, first)
        assert said in first and "Error" not in r.output, (command, r.output)
    for reader, args in READERS.items():
        extra = ("-o", str(tmp_path / "t.html")) if reader == "timeline" else ()
        r = cli(*args, *extra)
        assert r.exit_code == 1, (reader, r.output)
        assert _first_stderr(r).startswith("TAMPERED: the log's hash chain is broken at position"), (reader, r.stderr)
        if reader == "export":  # the rows as stored are the evidence: every one is written, each a JSON line
            assert "error:" not in r.stderr, r.stderr
            assert len([json.loads(line) for line in r.stdout.splitlines()]) == 50, r.stdout


def test_export_writes_a_text_value_that_is_not_utf8_as_stored(clean_file: Path, tmp_path: Path) -> None:
    """sqlite3 cannot fetch such a row as text (hostile retest of issue 23: export stopped at
    it with a decode error); its bytes are written, JSON-escaped, as an edited BLOB's are."""
    cli, path = _copy(clean_file, tmp_path)
    _edit(path, "UPDATE events SET data = CAST(x'7b22ff227d' AS TEXT) WHERE position = 4")
    _edit(path, "UPDATE events SET stream_id = CAST(x'53ff31' AS TEXT) WHERE position = 9")
    r = cli("events", "export")
    assert r.exit_code == 1 and _first_stderr(r).startswith("TAMPERED: the log's hash chain is broken at position 4")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["position"] for row in rows] == list(range(1, 51))
    assert rows[3]["data"] == repr(b'{"\xff"}') and rows[8]["stream"] == repr(b"S\xff1")
    assert rows[4]["data"] == json.loads(cli("events", "export", "--from-position", "5").stdout.splitlines()[0])["data"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ("json_set(data, '$.turn_id', 'x')", "turn_id"),  # TurnCommitted at position 6 of S1
        ("json_set(data, '$.create_response', 'yes')", "create_response"),
        ("'[]'", "TurnCommitted"),
    ],
)
def test_a_reader_says_tampered_before_the_error_the_edited_row_causes(
    clean_file: Path, tmp_path: Path, edit: str, field: str
) -> None:
    cli, path = _copy(clean_file, tmp_path)
    conn = sqlite3.connect(path)
    position = conn.execute("SELECT min(position) FROM events WHERE type = 'TurnCommitted'").fetchone()[0]
    conn.close()
    _edit(path, f"UPDATE events SET data = {edit} WHERE position = {position}")
    for reader, args in {
        **READERS,
        "tables-json": ("tables", "--format", "json"),
        "audit-s1": ("audit", "--session", "S1"),
    }.items():
        extra = ("-o", str(tmp_path / "t.html")) if reader == "timeline" else ()
        r = cli(*args, *extra)
        assert r.exit_code == 1, (reader, r.output)
        lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("note: ")]
        assert lines[0].startswith(f"TAMPERED: the log's hash chain is broken at position {position}: edited"), (
            reader,
            r.stderr,
        )
    r = cli("verify")
    assert r.exit_code == 1 and r.stdout.startswith(f"TAMPERED: log position {position}: edited"), r.output


def test_events_export_of_a_tampered_ledger_says_so_first_and_exits_1(clean_file: Path, tmp_path: Path) -> None:
    cli, path = _copy(clean_file, tmp_path)
    clean = cli("events", "export")
    assert clean.exit_code == 0 and "TAMPERED" not in clean.output
    _edit(path, "UPDATE events SET ts_us = ts_us + 1 WHERE position = 20")
    r = cli("events", "export")
    assert r.exit_code == 1
    assert _first_stderr(r).startswith("TAMPERED: the log's hash chain is broken at position 20: edited")
    assert len(r.stdout.splitlines()) == 50  # the log as stored is still exported: it is the evidence


def _forge_index(path: Path, hide: str) -> None:
    """Point the (stream_id, version) index of ``events`` at a b-tree built without session
    ``hide``: a lookup of that session finds nothing, while every row's hash is intact."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        name = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' AND sql IS NULL "
            "ORDER BY name LIMIT 1"
        ).fetchone()[0]
        conn.execute("CREATE TABLE forged (position INTEGER PRIMARY KEY, stream_id TEXT, version BIGINT)")
        conn.execute("INSERT INTO forged SELECT position, stream_id, version FROM events WHERE stream_id != ?", (hide,))
        conn.execute("CREATE UNIQUE INDEX forged_ix ON forged (stream_id, version)")
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'forged_ix'").fetchone()[0]
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = ?", (root, name))
        conn.execute("DELETE FROM sqlite_master WHERE name IN ('forged', 'forged_ix')")
        conn.execute("PRAGMA writable_schema = OFF")
    finally:
        conn.close()


@pytest.mark.parametrize("hide", ["S2", "S3"])
def test_an_index_pointed_at_a_forged_btree_is_tampering_not_a_vanished_session(
    clean_file: Path, tmp_path: Path, hide: str
) -> None:
    cli, path = _copy(clean_file, tmp_path)
    conn = sqlite3.connect(path)
    first = conn.execute("SELECT min(position) FROM events WHERE stream_id = ?", (hide,)).fetchone()[0]
    conn.close()
    assert cli("tables", "--session", hide).exit_code == 0
    _forge_index(path, hide)
    for command in ("verify", "digest"):
        r = cli(command)
        assert r.exit_code == 1, (command, r.output)
        assert r.stdout.startswith(f"TAMPERED: database structure at position {first}: index "), r.output
        assert "lacks the row" in r.stdout
    readers = {
        "audit": ("audit", "--session", hide),
        "tables": ("tables", "--session", hide),
        "timeline": ("timeline", "--session", hide, "-o", str(tmp_path / "t.html")),
        "export": ("events", "export", "--stream", hide),
        "audit-all": ("audit",),
        "metrics": ("metrics",),
    }
    for reader, args in readers.items():
        r = cli(*args)
        assert r.exit_code == 1, (reader, r.output)
        assert _first_stderr(r).startswith(
            f"TAMPERED: the ledger's index does not match its log at position {first}"
        ), (reader, r.stderr)


STATS = {
    "keyword": "UPDATE sqlite_stat1 SET stat = stat || ' unordered' WHERE idx LIKE 'sqlite_autoindex_events%'",
    "size-hint": "UPDATE sqlite_stat1 SET stat = stat || ' sz=9' WHERE idx = 'ix_events_lifecycle'",
    "too-few": "UPDATE sqlite_stat1 SET stat = '50' WHERE idx LIKE 'sqlite_autoindex_events%'",
    "not-numbers": "UPDATE sqlite_stat1 SET stat = 'a b c' WHERE idx LIKE 'sqlite_autoindex_events%'",
    "blob-stat": "UPDATE sqlite_stat1 SET stat = CAST(stat AS BLOB) WHERE idx = 'ix_events_lifecycle'",
    "unknown-table": "INSERT INTO sqlite_stat1 VALUES ('elsewhere', NULL, '5')",
    "unknown-index": "INSERT INTO sqlite_stat1 VALUES ('events', 'no_such_index', '5 1')",
    "twice": "INSERT INTO sqlite_stat1 SELECT tbl, idx, stat FROM sqlite_stat1 WHERE idx = 'ix_events_lifecycle'",
    # SQLite reserves the sqlite_stat names: a forger writes them through writable_schema
    "stat4-bad-row": "CREATE TABLE x4(tbl,idx,neq,nlt,ndlt,sample); "
    "INSERT INTO x4 VALUES ('events', 'ix_events_lifecycle', 'a', '1 1', '1 1', x'00'); PRAGMA writable_schema=ON; "
    "UPDATE sqlite_master SET name = 'sqlite_stat4', tbl_name = 'sqlite_stat4', "
    "sql = 'CREATE TABLE sqlite_stat4(tbl,idx,neq,nlt,ndlt,sample)' WHERE name = 'x4'; PRAGMA writable_schema=OFF",
    "stat1-other-text": "PRAGMA writable_schema=ON; UPDATE sqlite_master SET "
    "sql = 'CREATE TABLE sqlite_stat1(tbl,idx,stat,extra)' WHERE name = 'sqlite_stat1'; PRAGMA writable_schema=OFF",
}


def _analyzed(clean_file: Path, tmp_path: Path) -> tuple[Cli, Path]:
    cli, path = _copy(clean_file, tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("ANALYZE")
    conn.commit()
    conn.close()
    return cli, path


def test_analyzes_own_statistics_are_accepted(clean_file: Path, tmp_path: Path) -> None:
    cli, _ = _analyzed(clean_file, tmp_path)
    assert cli("verify").exit_code == 0
    assert cli("audit").exit_code in (0, 1) and "TAMPERED" not in cli("audit").output


@pytest.mark.parametrize("kind", sorted(STATS))
def test_statistics_in_a_shape_analyze_never_writes_are_tampering(clean_file: Path, tmp_path: Path, kind: str) -> None:
    cli, path = _analyzed(clean_file, tmp_path)
    conn = sqlite3.connect(path)
    conn.executescript(STATS[kind])
    conn.commit()
    conn.close()
    before = path.read_bytes()
    for command in ("verify", "digest"):
        r = cli(command)
        assert r.exit_code == 1 and r.stdout.startswith("TAMPERED: schema: "), (command, r.output)
        assert "sqlite_stat" in r.stdout
    for args in (("audit",), ("tables",), ("events", "export")):
        r = cli(*args)
        assert r.exit_code == 2 and "sqlite_stat" in r.output, (args, r.output)
    assert path.read_bytes() == before


def test_on_both_backends_a_reader_says_tampered_before_the_validation_error(cli: Cli, tmp_path: Path) -> None:
    """The same on PostgreSQL (the owner disables the guard, edits, enables it again)."""
    import asyncio

    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    sqlite = cli.url.startswith("sqlite")
    if not sqlite:
        assert cli("db", "upgrade").exit_code == 0
    assert cli("events", "import", str(LOG)).exit_code == 0
    edit = (
        "UPDATE events SET data = json_set(data, '$.turn_id', 'x') WHERE position = {p}"
        if sqlite
        else "UPDATE events SET data = jsonb_set(data::jsonb, '{{turn_id}}', '\"x\"')::text WHERE position = {p}"
    )
    lift, put_back = (
        ("DROP TRIGGER events_no_update", SQLITE_TRIGGERS["events_no_update"])
        if sqlite
        else (
            "ALTER TABLE events DISABLE TRIGGER events_no_update_delete",
            "ALTER TABLE events ENABLE TRIGGER events_no_update_delete",
        )
    )

    async def forge() -> int:
        engine = create_async_engine(cli.url)
        try:
            async with engine.begin() as conn:
                p = (
                    await conn.execute(sa.text("SELECT min(position) FROM events WHERE type = 'TurnCommitted'"))
                ).scalar_one()
                for statement in (lift, edit.format(p=p), put_back):
                    await conn.execute(sa.text(statement))
                return int(p)
        finally:
            await engine.dispose()

    position = asyncio.run(forge())
    for reader, args in READERS.items():
        extra = ("-o", str(tmp_path / "t.html")) if reader == "timeline" else ()
        r = cli(*args, *extra)
        assert r.exit_code == 1, (reader, r.output)
        assert _first_stderr(r).startswith(f"TAMPERED: the log's hash chain is broken at position {position}"), (
            reader,
            r.stderr,
        )
        assert "turn_id" in r.stderr or reader == "export", (reader, r.stderr)
