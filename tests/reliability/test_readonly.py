"""Read commands leave any file byte-identical; a file that is not a ledger is exit 2 "not a
duplex-ledger database" and is not changed by any command (issue 11 point 6). SQLite only:
the point is about files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.reliability.support import LOG, cli, fingerprint, refused_cleanly


def foreign_sqlite(path: Path) -> None:
    """Another application's database, in rollback-journal mode."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()


def foreign_with_alembic(path: Path) -> None:
    """Another Alembic-managed application: its own revision, no events table."""
    foreign_sqlite(path)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
    conn.execute("INSERT INTO alembic_version VALUES ('ae1027a6acf')")
    conn.commit()
    conn.close()


FILES = {
    "foreign sqlite": foreign_sqlite,
    "foreign alembic app": foreign_with_alembic,
    "text file": lambda p: p.write_text("hello, I am not a database\n" * 50),
    "binary junk": lambda p: p.write_bytes(bytes(range(256)) * 20),
}
READ = [("events", "export"), ("audit",), ("tables",), ("db", "current"), ("events", "tail")]
WRITE = [
    ("db", "upgrade"),
    ("db", "downgrade", "base", "--yes"),
    ("rebuild", "--quiet"),
    ("events", "import", str(LOG)),
]


@pytest.mark.parametrize("command", READ + WRITE, ids=" ".join)
@pytest.mark.parametrize("kind", sorted(FILES))
def test_a_file_that_is_not_a_ledger_is_refused_untouched(tmp_path, kind: str, command: tuple[str, ...]) -> None:
    path = tmp_path / "other.db"
    FILES[kind](path)
    before = fingerprint(path)
    result = cli(*command, "--db", f"sqlite+aiosqlite:///{path}")
    refused_cleanly(result, 2)
    assert "not a duplex-ledger database" in result.output
    assert fingerprint(path) == before


@pytest.mark.parametrize("command", READ, ids=" ".join)
def test_a_zero_byte_file_stays_zero_bytes(tmp_path, command: tuple[str, ...]) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    result = cli(*command, "--db", f"sqlite+aiosqlite:///{path}")
    if command == ("db", "current"):
        assert result.exit_code == 0 and result.output.startswith("none (")
    else:
        refused_cleanly(result, 2)
        assert "no duplex-ledger schema" in result.output
    assert path.stat().st_size == 0 and fingerprint(path) == {
        "main": fingerprint(path)["main"],
        "-wal": None,
        "-shm": None,
        "-journal": None,
    }


@pytest.mark.parametrize("command", READ[:1] + READ[3:4], ids=" ".join)
def test_read_commands_leave_a_ledger_byte_identical(tmp_path, command: tuple[str, ...]) -> None:
    path = tmp_path / "ledger.db"
    url = f"sqlite+aiosqlite:///{path}"
    assert cli("events", "import", str(LOG), "--db", url).exit_code == 0
    before = fingerprint(path)["main"]
    assert cli(*command, "--db", url).exit_code == 0
    assert fingerprint(path)["main"] == before


def test_a_directory_is_not_a_ledger(tmp_path) -> None:
    for command in READ + WRITE:
        result = cli(*command, "--db", f"sqlite+aiosqlite:///{tmp_path}")
        refused_cleanly(result, 2)
        assert "is a directory" in result.output
    assert list(tmp_path.iterdir()) == []


def test_upgrade_to_an_unknown_revision_leaves_no_file(tmp_path) -> None:
    path = tmp_path / "new" / "ledger.db"
    result = cli("db", "upgrade", "nosuchrev", "--db", f"sqlite+aiosqlite:///{path}")
    refused_cleanly(result, 2)
    assert "unknown schema revision 'nosuchrev'" in result.output
    assert not path.parent.exists()
