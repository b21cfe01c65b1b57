"""A SQLite ledger file's own structure, as evidence (issue 22): an edit that leaves every row's
hash intact can still change what a reader sees, through the b-trees SQLite looks rows up by.

* :func:`index_fault` — every index of ``events`` the readers rely on (``(stream_id, version)``
  for a session's events and versions, ``event_id`` for idempotent appends, the partial
  ``ix_events_lifecycle``) holds exactly the table's rows: an index pointed at a forged
  b-tree (``PRAGMA writable_schema``) makes a session vanish from ``--session`` lookups, or
  appear with rows it does not have. The first position where index and table disagree is
  named. Each index is read as SQLite reads it for a lookup (``INDEXED BY``, a covering scan)
  and compared with a scan of the table (``NOT INDEXED``), both ways (``EXCEPT``), plus the
  entry counts (a duplicated entry).
* :func:`structure_problems` — ``PRAGMA integrity_check``: b-tree pages, every index of every
  table against its table, NOT NULL and CHECK constraints (what ``verify`` and ``digest`` run).
* :func:`stat_problems` — ``sqlite_stat1`` (the only statistics table this SQLite's
  ``ANALYZE`` makes; ``sqlite_stat4`` with ``SQLITE_ENABLE_STAT4`` builds) must hold rows in
  the shape ``ANALYZE`` writes: a ledger table, one of its indexes (or NULL), and as many
  non-negative integers as the index has columns plus one — no keywords (``unordered``,
  ``sz=``, ``noskipscan``), no text the query planner would parse into something else. The
  schema check (:mod:`events.store.sqlite_schema`) refuses any other shape, so the planner
  never reads anything but counts.

All functions take a plain ``sqlite3`` connection (read-only is enough) and run nothing the
file defines: the schema check refused any view, trigger or expression index before.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Any, Protocol

EVENTS_INDEXES_SQL = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' ORDER BY name"
_WHERE = re.compile(r"\bWHERE\b(.*)$", re.IGNORECASE | re.DOTALL)
_STAT_NUMBERS = re.compile(r"(0|[1-9][0-9]{0,18})( (0|[1-9][0-9]{0,18}))*")
STAT_TABLES: dict[str, str] = {
    "sqlite_stat1": "CREATE TABLE sqlite_stat1(tbl,idx,stat)",
    "sqlite_stat4": "CREATE TABLE sqlite_stat4(tbl,idx,neq,nlt,ndlt,sample)",
}
"""The statistics tables ``ANALYZE`` creates, with the text SQLite gives them."""


@dataclass(frozen=True, slots=True)
class IndexFault:
    """The first ``position`` where index ``index`` of ``events`` and the table disagree, and
    a sentence."""

    position: int
    index: str
    detail: str


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(conn: SqlReader, index: str) -> list[str]:
    return [row[2] for row in conn.execute(f"PRAGMA index_info({_quote(index)})") if row[2] is not None]


def index_fault(conn: sqlite3.Connection, until_position: int | None = None) -> IndexFault | None:
    """The first disagreement between an index of ``events`` and the table (rows with
    ``position <= until_position`` when given), None when every index holds exactly the
    table's rows. Raises sqlite3.Error for a file SQLite cannot read."""
    found: list[IndexFault] = []
    for name, sql in conn.execute(EVENTS_INDEXES_SQL).fetchall():
        cols = _columns(conn, name)
        if not cols:
            continue
        where = _WHERE.search(sql or "")
        conds = [f"({where.group(1).strip()})"] if where else []
        if until_position is not None:
            conds.append(f"position <= {int(until_position)}")
        filt = f" WHERE {' AND '.join(conds)}" if conds else ""
        keys = ", ".join(_quote(c) for c in cols)
        via_index = f"SELECT {keys}, position FROM events INDEXED BY {_quote(name)}{filt}"
        via_table = f"SELECT {keys}, position FROM events NOT INDEXED{filt}"
        position = conn.execute(
            f"SELECT min(p) FROM (SELECT position AS p FROM ({via_index} EXCEPT {via_table}) "
            f"UNION ALL SELECT position AS p FROM ({via_table} EXCEPT {via_index}))"
        ).fetchone()[0]
        if position is None:
            counted = conn.execute(f"SELECT count(*) FROM ({via_index})").fetchone()[0]
            rows = conn.execute(f"SELECT count(*) FROM ({via_table})").fetchone()[0]
            if counted == rows:
                continue
            position = conn.execute(
                f"SELECT min(position) FROM (SELECT position FROM ({via_index}) GROUP BY position HAVING count(*) > 1)"
            ).fetchone()[0]
            if position is None:
                continue
        found.append(IndexFault(int(position), name, _describe(conn, name, cols, via_index, via_table, position)))
    return min(found, key=lambda f: f.position) if found else None


def _describe(
    conn: sqlite3.Connection, name: str, cols: list[str], via_index: str, via_table: str, position: int
) -> str:
    at = "AND" if " WHERE " in via_index else "WHERE"
    indexed = conn.execute(f"{via_index} {at} position = ?", (position,)).fetchall()
    stored = conn.execute(f"{via_table} {at} position = ?", (position,)).fetchall()
    shown = f"index {name} ({', '.join(cols)})"
    if not indexed:
        what = f"lacks the row at position {position} ({_row(stored)})"
    elif not stored:
        what = f"holds an entry for position {position} ({_row(indexed)}) that the table does not have"
    elif len(indexed) > 1:
        what = f"holds the row at position {position} {len(indexed)} times"
    else:
        what = f"says position {position} is {_row(indexed)}, the table says {_row(stored)}"
    return (
        f"{shown} {what}: its b-tree was forged or damaged, so a reader looking rows up by it "
        "would not see the log as stored"
    )


def _row(rows: list[tuple[object, ...]]) -> str:
    return ", ".join(repr(v)[:60] for v in rows[0][:-1]) if rows else "no row"


def structure_problems(conn: sqlite3.Connection, table: str | None = None, limit: int = 5) -> list[str]:
    """What ``PRAGMA integrity_check`` finds (at most ``limit`` lines; ``table``: that table
    and its indexes only), [] for a sound file."""
    arg = _quote(table) if table is not None else str(int(limit))
    lines: list[str] = []
    for (text,) in conn.execute(f"PRAGMA integrity_check({arg})"):
        lines += [ln.strip() for ln in str(text).splitlines() if ln.strip() and not ln.startswith("***")]
    return [] if lines == ["ok"] else lines[:limit]


_ROW = re.compile(r"\brow (\d+)\b")


def structure_fault(conn: sqlite3.Connection, table: str | None = None) -> IndexFault | None:
    """The file's structure as a fault (None: ``PRAGMA integrity_check`` finds nothing;
    ``table="events"``: the log and its indexes only, what every reader checks): the first
    position where an index of ``events`` and the table disagree (:func:`index_fault`), else
    SQLite's own first lines, at the row they name (0 when they name none)."""
    problems = structure_problems(conn, table)
    if not problems:
        return None
    named = index_fault(conn)
    if named is not None:
        return named
    rows = [int(m.group(1)) for p in problems if (m := _ROW.search(p))]
    return IndexFault(
        min(rows) if rows else 0,
        "",
        f"SQLite's integrity check fails ({'; '.join(problems)}): b-trees were forged or damaged",
    )


class SqlReader(Protocol):
    """What the statistics checks read through: a ``sqlite3`` connection, or a SQLAlchemy one
    adapted (:mod:`events.store.sqlite_schema`)."""

    def execute(self, sql: str, params: tuple[Any, ...] = ..., /) -> Any: ...


def stat_problems(conn: SqlReader) -> list[str]:
    """Every way the ``sqlite_stat*`` tables depart from what ``ANALYZE`` writes (module
    doc), [] when they hold its shape (or are absent)."""
    problems: list[str] = []
    tables = {
        name: sql
        for name, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE name LIKE 'sqlite\\_stat%' ESCAPE '\\'"
        )
    }
    for name, sql in sorted(tables.items()):
        expected = STAT_TABLES.get(name)
        if expected is None:
            problems.append(f"table {name} (no ANALYZE of this SQLite makes it)")
        elif sql != expected:
            problems.append(f"table {name} (its text is not ANALYZE's: {sql!r:.80})")
    if problems:
        return problems
    if "sqlite_stat1" in tables:
        problems += _stat1_problems(conn)
    if "sqlite_stat4" in tables:
        problems += _stat4_problems(conn)
    return problems


def _indexes_of(conn: SqlReader) -> dict[tuple[str, str], int]:
    """(table, index) -> the index's column count, for every index of every ordinary table."""
    out: dict[tuple[str, str], int] = {}
    for name, table in conn.execute(
        "SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' AND tbl_name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
    ):
        out[(table, name)] = len(_columns(conn, name))
    return out


def _ledger_tables(conn: SqlReader) -> set[str]:
    return {
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
        )
    }


def _stat1_problems(conn: SqlReader) -> list[str]:
    indexes, tables = _indexes_of(conn), _ledger_tables(conn)
    problems: list[str] = []
    seen: set[tuple[object, object]] = set()
    for n, (tbl, idx, stat) in enumerate(conn.execute("SELECT tbl, idx, stat FROM sqlite_stat1 ORDER BY rowid"), 1):
        where = f"sqlite_stat1 row {n} ({tbl!r:.40}, {idx!r:.40})"
        if type(tbl) is not str or tbl not in tables:
            problems.append(f"{where}: tbl is not a table of the ledger")
            continue
        if idx is not None and (type(idx) is not str or (tbl, idx) not in indexes):
            problems.append(f"{where}: idx is not an index of {tbl}")
            continue
        if (tbl, idx) in seen:
            problems.append(f"{where}: given twice")
        seen.add((tbl, idx))
        want = 1 if idx is None else indexes[(tbl, idx)] + 1
        if type(stat) is not str or not _STAT_NUMBERS.fullmatch(stat) or len(stat.split(" ")) != want:
            problems.append(f"{where}: stat {stat!r:.60} is not {want} integer(s), as ANALYZE writes")
    return problems


def _stat4_problems(conn: SqlReader) -> list[str]:
    indexes = _indexes_of(conn)
    problems: list[str] = []
    for n, (tbl, idx, neq, nlt, ndlt, sample) in enumerate(
        conn.execute("SELECT tbl, idx, neq, nlt, ndlt, sample FROM sqlite_stat4 ORDER BY rowid"), 1
    ):
        where = f"sqlite_stat4 row {n} ({tbl!r:.40}, {idx!r:.40})"
        if type(tbl) is not str or type(idx) is not str or (tbl, idx) not in indexes:
            problems.append(f"{where}: not an index of a ledger table")
            continue
        want = indexes[(tbl, idx)] + 1
        for label, value in (("neq", neq), ("nlt", nlt), ("ndlt", ndlt)):
            if type(value) is not str or not _STAT_NUMBERS.fullmatch(value) or len(value.split(" ")) != want:
                problems.append(f"{where}: {label} is not {want} integer(s)")
        if type(sample) is not bytes:
            problems.append(f"{where}: sample is not a record (blob)")
    return problems


def readonly(path: str) -> sqlite3.Connection:
    """A plain read-only ``sqlite3`` connection to the ledger file at ``path``."""
    from events.store.url import readonly_file_uri

    return sqlite3.connect(readonly_file_uri(path), uri=True)
