"""``events.store.sidecars``: the -wal/-shm files a read-only SQLite connection creates beside a
WAL-mode ledger are removed after the read only when SQLite itself would remove them — no
connection of any process (this one included) holds the file, and the -wal is empty — and
never under a live writer, whose appends the read sees. Real SQLite files and processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from events.store import sidecars
from events.store.sidecars import no_new_sidecars, remove_new_sidecars, sidecars_missing
from reports.cli import app
from tests.cli.streams import LOGS, cli_env, imported, url_of

CASE_18 = LOGS.parent / "field" / "CASE-18.jsonl"
pytestmark = pytest.mark.skipif(sidecars._F_OFD_SETLK is None, reason="no open-file-description locks here")


def _wal_db(path: Path) -> Path:
    """A WAL-mode database with one row, every connection closed (SQLite removed its files)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x INTEGER)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    conn.close()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    return path


def _read_only(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)
    return conn


def _names(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def _my_locks_on(path: Path) -> list[str]:
    """This process's POSIX locks on ``path`` (/proc/locks)."""
    inode = os.stat(path).st_ino
    mine = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] == "->":
            fields = fields[1:]
        if fields[1] == "POSIX" and int(fields[4]) == os.getpid() and int(fields[5].split(":")[-1]) == inode:
            mine.append(line)
    return mine


def test_a_read_only_read_leaves_the_files_sqlite_cannot_remove_and_they_are_removed(tmp_path: Path) -> None:
    db = _wal_db(tmp_path / "l.db")
    before = db.read_bytes()
    missing = sidecars_missing(db)
    assert missing == ("-wal", "-shm")
    _read_only(db).close()
    assert _names(db) == ["l.db", "l.db-shm", "l.db-wal"]  # what the hostile pass saw
    assert sorted(p.name for p in remove_new_sidecars(db, missing)) == ["l.db-shm", "l.db-wal"]
    assert _names(db) == ["l.db"] and db.read_bytes() == before


def test_nothing_is_removed_while_a_connection_of_this_process_holds_the_file(tmp_path: Path) -> None:
    """The lock that says "nobody holds it" must also see this process's own SQLite locks, and
    checking must not drop them (closing any descriptor of a file drops the process's POSIX
    locks on it: the descriptor whose lock was refused is kept open)."""
    db = _wal_db(tmp_path / "l.db")
    missing = sidecars_missing(db)
    live = _read_only(db)  # holds a shared lock on the database and the -shm while open
    try:
        held = _my_locks_on(db)
        assert held
        assert remove_new_sidecars(db, missing) == []
        assert _names(db) == ["l.db", "l.db-shm", "l.db-wal"]
        assert _my_locks_on(db) == held  # still held: the live connection is intact
        assert live.execute("SELECT x FROM t").fetchall() == [(1,)]
    finally:
        live.close()
    assert len(remove_new_sidecars(db, missing)) == 2 and _names(db) == ["l.db"]


def test_files_that_were_there_before_the_read_are_left_alone(tmp_path: Path) -> None:
    db = _wal_db(tmp_path / "l.db")
    _read_only(db).close()  # an earlier reader's leftovers
    with no_new_sidecars(db):
        _read_only(db).close()
    assert _names(db) == ["l.db", "l.db-shm", "l.db-wal"]


KILLED_WRITER = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("INSERT INTO t VALUES (2)")
conn.commit()
os._exit(0)  # no close: the commit stays in the -wal, as after a crash
"""


def test_a_wal_holding_commits_is_kept(tmp_path: Path) -> None:
    """A writer that committed during the read and could not checkpoint (it died, or the read's
    lock stopped its checkpoint at close) leaves its transactions in the -wal: kept."""
    db = _wal_db(tmp_path / "l.db")
    with no_new_sidecars(db):
        reader = _read_only(db)
        subprocess.run([sys.executable, "-c", KILLED_WRITER, str(db)], check=True, timeout=60)
        reader.close()
    assert _names(db) == ["l.db", "l.db-shm", "l.db-wal"] and (tmp_path / "l.db-wal").stat().st_size > 0
    check = sqlite3.connect(db)
    assert check.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    check.close()


LIVE_WRITER = """
import asyncio, sys
from events import jsonl
from events.store import EventStore

async def main():
    store = await EventStore.open(sys.argv[1])
    with open(sys.argv[2], "rb") as fh:
        rows = jsonl.parse_lines(fh)
    await jsonl.import_rows(store, rows)
    print("appended", flush=True)
    sys.stdin.readline()  # open until the test is done reading
    await store.close()

asyncio.run(main())
"""


def test_a_read_beside_a_live_writer_sees_its_appends_and_leaves_its_files(tmp_path: Path) -> None:
    url = imported(CASE_18, tmp_path / "l.db")  # 23 events
    assert _names(tmp_path / "l.db") == ["l.db"]
    writer = subprocess.Popen(
        [sys.executable, "-c", LIVE_WRITER, url, str(LOGS / "worked-example.jsonl")],  # 8 more
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **cli_env(),
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "appended\n"
        wal = tmp_path / "l.db-wal"
        assert wal.stat().st_size > 0  # the appends are in the -wal, not yet in l.db
        export = CliRunner().invoke(app, ["events", "export", "--db", url])
        assert export.exit_code == 0 and len(export.output.splitlines()) == 31
        assert _names(tmp_path / "l.db") == ["l.db", "l.db-shm", "l.db-wal"] and wal.stat().st_size > 0
    finally:
        assert writer.stdin is not None
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0
    assert _names(tmp_path / "l.db") == ["l.db"]  # the writer's own close removed them
    export = CliRunner().invoke(app, ["events", "export", "--db", url_of(tmp_path / "l.db")])
    assert len(export.output.splitlines()) == 31


def test_a_file_held_by_this_process_costs_one_kept_descriptor_however_often_it_is_tried(tmp_path: Path) -> None:
    db = _wal_db(tmp_path / "l.db")
    missing = sidecars_missing(db)
    live = _read_only(db)
    try:
        kept = len(sidecars._KEPT_OPEN)
        for _ in range(5):
            assert remove_new_sidecars(db, missing) == []
        assert len(sidecars._KEPT_OPEN) == kept + 1
    finally:
        live.close()
    assert len(remove_new_sidecars(db, missing)) == 2 and len(sidecars._KEPT_OPEN) == kept  # reused, then closed


def test_a_read_through_a_symbolic_link_leaves_nothing_beside_the_file_it_names(tmp_path: Path) -> None:
    """SQLite follows the link: its -wal/-shm are created beside the target, not the link."""
    url = imported(CASE_18, tmp_path / "l.db")
    elsewhere = tmp_path / "links"
    elsewhere.mkdir()
    (elsewhere / "link.db").symlink_to(tmp_path / "l.db")
    for command in (["sessions"], ["events", "export"], ["audit"]):
        result = CliRunner().invoke(app, [*command, "--db", url_of(elsewhere / "link.db")])
        assert result.exit_code == 0, result.output
        assert _names(tmp_path / "l.db") == ["l.db", "links"], command
        assert _names(elsewhere / "link.db") == ["link.db"], command
    export = CliRunner().invoke(app, ["events", "export", "--db", url])
    assert len(export.output.splitlines()) == 23 and _names(tmp_path / "l.db") == ["l.db", "links"]
