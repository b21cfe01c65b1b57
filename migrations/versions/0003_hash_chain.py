"""Hash chain over the log; SQLite refuses an insert that would replace a row; checkpoints
become plain data.

Revision ID: 0003_hash_chain
Revises: 0002_read_models
Create Date: 2026-12-01

* ``events.hash`` (32 bytes): ``SHA-256(previous hash ‖ canonical bytes of the row)``
  (:mod:`events.chain`), backfilled here for every existing row in position order (the
  append-only triggers are lifted for the backfill only, inside this transaction).
* SQLite: ``events_no_replace``, a BEFORE INSERT trigger refusing a row whose position,
  event id or (stream, version) is already stored. ``INSERT OR REPLACE`` / ``REPLACE INTO``
  resolve such a conflict by deleting the old row, without firing the DELETE trigger; the
  BEFORE INSERT trigger runs before that resolution and aborts it.
* ``projection_checkpoints``: pickled states are dropped (the runner rebuilds; the state is
  now versioned plain data, :mod:`projections.shell.checkpoint`).

Frozen history; matches ``events.store.schema`` and ``projections.shell.readmodels``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from events.chain import GENESIS, row_hash

revision = "0003_hash_chain"
down_revision = "0002_read_models"
branch_labels = None
depends_on = None

_SQLITE_NO_REPLACE = (
    "CREATE TRIGGER events_no_replace BEFORE INSERT ON events "
    "WHEN EXISTS (SELECT 1 FROM events WHERE position = NEW.position) "
    "OR EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id) "
    "OR EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version) "
    "BEGIN SELECT RAISE(ABORT, 'events is append-only: an insert may not replace a stored row'); END"
)
_SQLITE_NO_UPDATE = (
    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events "
    "BEGIN SELECT RAISE(ABORT, 'events is append-only: UPDATE refused'); END"
)
_COLUMNS = "position, stream_id, version, event_id, type, schema_version, ts_us, recorded_at_us, data"
_BATCH = 10_000


def _backfill(conn: sa.Connection) -> None:
    previous, last = GENESIS, 0
    while True:
        rows = conn.execute(
            sa.text(f"SELECT {_COLUMNS} FROM events WHERE position > :p ORDER BY position LIMIT {_BATCH}"), {"p": last}
        ).all()
        if not rows:
            return
        updates = []
        for row in rows:
            previous = row_hash(previous, *row)
            updates.append({"h": previous, "p": row[0]})
        conn.execute(sa.text("UPDATE events SET hash = :h WHERE position = :p"), updates)
        last = rows[-1][0]


def upgrade() -> None:
    conn = op.get_bind()
    op.add_column("events", sa.Column("hash", sa.LargeBinary, nullable=True))
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE events DISABLE TRIGGER events_no_update_delete")
        _backfill(conn)
        op.execute("ALTER TABLE events ENABLE TRIGGER events_no_update_delete")
    else:
        op.execute("DROP TRIGGER events_no_update")
        _backfill(conn)
        op.execute(_SQLITE_NO_UPDATE)
        op.execute(_SQLITE_NO_REPLACE)
    op.execute("DELETE FROM projection_checkpoints")


def downgrade() -> None:
    conn = op.get_bind()
    op.execute("DELETE FROM projection_checkpoints")
    if conn.dialect.name == "postgresql":
        op.drop_column("events", "hash")
    else:
        op.execute("DROP TRIGGER events_no_replace")
        op.execute("ALTER TABLE events DROP COLUMN hash")
