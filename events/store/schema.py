"""The code's view of the ``events`` table (SQLAlchemy Core), used for queries.

The DDL itself lives in the Alembic revisions under ``migrations/versions`` (frozen
history); this module must match the head revision. Columns:

* ``position`` — global, gap-free, in commit order (1, 2, …); primary key.
* ``stream_id`` / ``version`` — the session stream and the event's place in it (1, 2, …);
  unique together.
* ``event_id`` — UUID as text, unique in the whole log.
* ``type`` / ``schema_version`` — event kind and the payload's schema version.
* ``ts_us`` — the event's own time, integer microseconds since the epoch, UTC (exact on both
  backends: CASE-08 part B).
* ``recorded_at_us`` — when the store committed it, integer microseconds since the epoch.
* ``data`` — the payload (no envelope) as compact JSON text.
* ``hash`` — SHA-256 chain link over the row and its predecessor (:mod:`events.chain`), 32
  bytes, written by the store in the append transaction (revision ``0003_hash_chain``).
"""

from __future__ import annotations

import sqlalchemy as sa

from events.chain import ROW_COLUMNS  # noqa: F401 - the events row's column order, declared once

metadata = sa.MetaData()

events = sa.Table(
    "events",
    metadata,
    sa.Column("position", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=False),
    sa.Column("stream_id", sa.Text, nullable=False),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("event_id", sa.Text, nullable=False),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("ts_us", sa.BigInteger, nullable=False),
    sa.Column("recorded_at_us", sa.BigInteger, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("hash", sa.LargeBinary, nullable=True),
    sa.UniqueConstraint("stream_id", "version", name="uq_events_stream_version"),
    sa.UniqueConstraint("event_id", name="uq_events_event_id"),
)
