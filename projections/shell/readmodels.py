"""SQL read models of the projections (tables created by migration 0002_read_models).

* ``rm_request_resources`` — one row per held key (session, stage_id, request_id) with its
  state (reserved / submitted / finished), fence and since-position;
* ``rm_audit_findings`` — the findings at the checkpoint (default max-idle);
* ``rm_turn_tables`` — one row per finalized turn, keyed (session_id, response_id); the
  table set as lossless JSON (``tables_json``; a stage row without its default values, see
  :func:`projections.shell.turn_rows.turn_to_json`) so ``duplex-ledger tables`` re-renders it
  byte for byte;
* ``projection_checkpoints`` — position + fold state as versioned plain data
  (:mod:`projections.shell.checkpoint`, bound to the log's chain hash at that position), written in
  the same transaction as the rows (exactly once, CASE-16).

Pure row builders (the turn rows and :func:`fold_batch`, which applies a batch and collects
them, live in :mod:`projections.shell.turn_rows`, free of any database driver, and are
re-exported here) + one synchronous write function per batch (run by the async runner).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from events.store.schema import events as events_table
from events.types import ts_to_us
from projections.findings import Finding
from projections.resources import ResourcesFold
from projections.shell import checkpoint
from projections.shell.turn_rows import (  # noqa: F401 - re-exported: the turn rows' builders
    TURN_COLUMNS,
    fold_batch,
    turn_from_json,
    turn_row,
    turn_to_json,
    turn_values,
)
from projections.turn_tables import TurnTables

metadata = sa.MetaData()

checkpoints = sa.Table(
    "projection_checkpoints",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("fold_version", sa.Integer, nullable=False),
    sa.Column("state", sa.LargeBinary, nullable=False),
    sa.Column("updated_at_us", sa.BigInteger, nullable=False),
)
request_resources = sa.Table(
    "rm_request_resources",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("stage_id", sa.Integer, primary_key=True),
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("fence_incarnation", sa.Integer),
    sa.Column("fence_epoch", sa.Integer),
    sa.Column("fence_turn_id", sa.Integer),
    sa.Column("since_position", sa.BigInteger, nullable=False),
    sa.Column("since_ts_us", sa.BigInteger, nullable=False),
)
audit_findings = sa.Table(
    "rm_audit_findings",
    metadata,
    sa.Column("finding_no", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("severity", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("session_id", sa.Text, nullable=False),
    sa.Column("stage_id", sa.Integer),
    sa.Column("request_id", sa.Text),
    sa.Column("first_position", sa.BigInteger, nullable=False),
    sa.Column("first_ts_us", sa.BigInteger, nullable=False),
    sa.Column("last_position", sa.BigInteger, nullable=False),
    sa.Column("last_ts_us", sa.BigInteger, nullable=False),
    sa.Column("evidence_positions", sa.Text, nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
)
turn_tables = sa.Table(
    "rm_turn_tables",
    metadata,
    sa.Column("session_id", sa.Text, primary_key=True),
    sa.Column("response_id", sa.Text, primary_key=True),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("turn_id", sa.Integer, nullable=False),
    sa.Column("finished_reason", sa.Text, nullable=False),
    sa.Column("arrival_ts_us", sa.BigInteger, nullable=False),
    sa.Column("finalize_ts_us", sa.BigInteger, nullable=False),
    sa.Column("finalize_position", sa.BigInteger, nullable=False),
    sa.Column("tables_json", sa.Text, nullable=False),
)
READ_MODEL_TABLES = (turn_tables, audit_findings, request_resources, checkpoints)


def resource_rows(fold: ResourcesFold, session_ids: Iterable[str]) -> list[dict[str, Any]]:
    rows = []
    for sid in session_ids:
        s = fold.sessions.get(sid)
        if s is None:
            continue
        for (stage_id, request_id), b in sorted(s.bindings.items()):
            inc, epoch, turn = b.fence if b.fence is not None else (None, None, None)
            rows.append(
                {
                    "session_id": sid,
                    "stage_id": stage_id,
                    "request_id": request_id,
                    "state": b.state,
                    "fence_incarnation": inc,
                    "fence_epoch": epoch,
                    "fence_turn_id": turn,
                    "since_position": b.since_position,
                    "since_ts_us": ts_to_us(b.since_ts),
                }
            )
    return rows


def finding_rows(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    return [
        {
            "finding_no": i,
            "severity": f.severity,
            "kind": f.kind,
            "session_id": f.session_id,
            "stage_id": f.stage_id,
            "request_id": f.request_id,
            "first_position": f.first_position,
            "first_ts_us": ts_to_us(f.first_ts),
            "last_position": f.last_position,
            "last_ts_us": ts_to_us(f.last_ts),
            "evidence_positions": json.dumps(list(f.evidence)),
            "detail": f.detail,
        }
        for i, f in enumerate(findings, 1)
    ]


# ---------------------------------------------------------------- batch write
def _insert_keeping_first(conn: Connection, table: sa.Table) -> Any:
    """An INSERT that keeps the row already stored under the same key. The fold emits one table
    per (session, response) and warns on a reused response id (``stale_finalize``); a log crafted
    to reuse one beyond what the fold remembers must not make the read models unbuildable."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        return insert(table).on_conflict_do_nothing()
    return table.insert().prefix_with("OR IGNORE")


SPOOL_SCHEMA = "dl_spool_"
"""Schema name prefix of a spool file attached to the write connection (:func:`insert_spooled`)."""


def _raw_sqlite(conn: Connection) -> Any:
    if conn.dialect.name != "sqlite":
        raise ValueError(f"spooled turn rows are copied on SQLite only, not {conn.dialect.name}")
    raw = conn.connection.dbapi_connection
    assert raw is not None
    return raw


def insert_spooled(conn: Connection, paths: Sequence[str]) -> None:
    """Copy the turn rows spooled to the SQLite files ``paths`` (a table ``turns`` of
    :data:`TURN_COLUMNS`, rows in spool order: :func:`projections.shell.parallel.folded_partition`)
    into ``rm_turn_tables`` in the transaction ``conn`` (a SQLite write connection) is in, the
    first row of a key kept (:func:`_insert_keeping_first`). Each file is attached and copied
    by one ``INSERT … SELECT``: no row becomes a Python object. SQLite detaches a database only
    outside the transaction that read it: call :func:`detach_spooled` after this transaction
    ends, committed or not."""
    raw, columns = _raw_sqlite(conn), ", ".join(TURN_COLUMNS)
    for i, path in enumerate(paths):
        raw.execute(f"ATTACH DATABASE ? AS {SPOOL_SCHEMA}{i}", (path,))
        raw.execute(f"INSERT OR IGNORE INTO rm_turn_tables ({columns}) SELECT {columns} FROM {SPOOL_SCHEMA}{i}.turns")


def detach_spooled(conn: Connection) -> None:
    """Detach every spool file :func:`insert_spooled` attached to this connection (run in a
    later transaction than the one that read them, whether that one committed or failed: the
    connection goes back to its pool either way)."""
    raw = _raw_sqlite(conn)
    for _, schema, _ in raw.execute("PRAGMA database_list").fetchall():
        if schema.startswith(SPOOL_SCHEMA):
            raw.execute(f"DETACH DATABASE {schema}")


def write_batch(
    conn: Connection,
    *,
    name: str,
    position: int,
    fold_version: int,
    state: bytes,
    turns: Iterable[dict[str, Any]],
    spooled: Sequence[str] = (),
    touched: Sequence[str],
    resources: Sequence[dict[str, Any]],
    findings: Sequence[dict[str, Any]],
    before_checkpoint: Any = None,
) -> None:
    """One transaction: rows of the batch, then the checkpoint: ``state`` (the body from
    :func:`projections.shell.checkpoint.encode_state`) sealed with ``position``, ``fold_version`` and
    the log's chain hash at ``position``, read in this transaction.

    ``turns``: rows as dicts, inserted in chunks; ``spooled``: the spool files of a parallel
    rebuild's partitions, whose rows SQLite copies itself (:func:`insert_spooled`; SQLite only,
    and the caller detaches them after the commit: :func:`detach_spooled`). ``before_checkpoint`` (tests) is called between the rows and the
    checkpoint write; if it raises, the whole transaction rolls back: rows and checkpoint never
    disagree (CASE-16)."""
    insert_turns = _insert_keeping_first(conn, turn_tables)
    chunk: list[dict[str, Any]] = []
    for row in turns:
        chunk.append(row)
        if len(chunk) >= 5000:
            conn.execute(insert_turns, chunk)
            chunk = []
    if chunk:
        conn.execute(insert_turns, chunk)
    if spooled:
        insert_spooled(conn, spooled)
    for chunk_start in range(0, len(touched), 500):
        ids = list(touched[chunk_start : chunk_start + 500])
        conn.execute(request_resources.delete().where(request_resources.c.session_id.in_(ids)))
    if resources:
        conn.execute(request_resources.insert(), list(resources))
    conn.execute(audit_findings.delete())
    if findings:
        conn.execute(audit_findings.insert(), list(findings))
    if before_checkpoint is not None:
        before_checkpoint()
    blob = checkpoint.seal(state, fold_version=fold_version, position=position, log_hash=log_hash_at(conn, position))
    conn.execute(checkpoints.delete().where(checkpoints.c.name == name))
    conn.execute(
        checkpoints.insert().values(
            name=name,
            position=position,
            fold_version=fold_version,
            state=blob,
            updated_at_us=int(time.time() * 1_000_000),
        )
    )


def log_hash_at(conn: Connection, position: int) -> bytes:
    """The chain hash stored at ``position`` (b"" when there is no such row or no hash)."""
    found = conn.execute(sa.select(events_table.c.hash).where(events_table.c.position == position)).scalar()
    return bytes(found) if isinstance(found, (bytes, bytearray, memoryview)) else b""


def clear_read_models(conn: Connection) -> None:
    """Drop every read-model row (``rebuild``); the events table is never touched."""
    for table in READ_MODEL_TABLES:
        conn.execute(table.delete())


def load_checkpoint(conn: Connection, name: str) -> tuple[int, int, bytes] | None:
    row = conn.execute(
        sa.select(checkpoints.c.position, checkpoints.c.fold_version, checkpoints.c.state).where(
            checkpoints.c.name == name
        )
    ).first()
    return None if row is None else (row.position, row.fold_version, row.state)


def turns_of_rows(
    rows: Iterable[dict[str, Any]], session_id: str | None = None, response_id: str | None = None
) -> list[TurnTables]:
    """:func:`load_turns` over rows held in memory (:func:`turn_row` dicts): the first row of
    each (session, response) kept, as the table keeps it, in finalize-position order."""
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        kept.setdefault((row["session_id"], row["response_id"]), row)
    chosen = [
        r
        for r in kept.values()
        if (session_id is None or r["session_id"] == session_id)
        and (response_id is None or r["response_id"] == response_id)
    ]
    chosen.sort(key=lambda r: (r["finalize_position"], r["session_id"]))
    return [turn_from_json(r["tables_json"], r) for r in chosen]


def load_turns(
    conn: Connection, session_id: str | None = None, response_id: str | None = None, until_position: int | None = None
) -> list[TurnTables]:
    q = sa.select(*(turn_tables.c[name] for name in TURN_COLUMNS)).order_by(
        turn_tables.c.finalize_position, turn_tables.c.session_id
    )
    if session_id is not None:
        q = q.where(turn_tables.c.session_id == session_id)
    if response_id is not None:
        q = q.where(turn_tables.c.response_id == response_id)
    if until_position is not None:
        q = q.where(turn_tables.c.finalize_position <= until_position)
    return [turn_from_json(r.tables_json, r._mapping) for r in conn.execute(q)]
