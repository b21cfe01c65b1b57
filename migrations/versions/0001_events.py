"""events table: the append-only log, with triggers refusing UPDATE/DELETE.

Revision ID: 0001_events
Revises:
Create Date: 2025-11-30

Frozen history: later schema changes go in new revisions, never here. The table matches
``events.store.schema.events``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_events"
down_revision = None
branch_labels = None
depends_on = None

_SQLITE_TRIGGERS = (
    "CREATE TRIGGER events_no_update BEFORE UPDATE ON events "
    "BEGIN SELECT RAISE(ABORT, 'events is append-only: UPDATE refused'); END",
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
    "BEGIN SELECT RAISE(ABORT, 'events is append-only: DELETE refused'); END",
)
_PG_TRIGGERS = (
    "CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN RAISE EXCEPTION 'events is append-only: % refused', TG_OP; END $$",
    "CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events "
    "FOR EACH ROW EXECUTE FUNCTION events_append_only()",
    "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
    "FOR EACH STATEMENT EXECUTE FUNCTION events_append_only()",
)


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column(
            "position", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=False
        ),
        sa.Column("stream_id", sa.Text, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("ts_us", sa.BigInteger, nullable=False),
        sa.Column("recorded_at_us", sa.BigInteger, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.UniqueConstraint("stream_id", "version", name="uq_events_stream_version"),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )
    triggers = _PG_TRIGGERS if op.get_bind().dialect.name == "postgresql" else _SQLITE_TRIGGERS
    for ddl in triggers:
        op.execute(ddl)


def downgrade() -> None:
    # Dropping the table removes its triggers on both backends (SQLite drops triggers before
    # the implicit delete, so they do not fire).
    op.drop_table("events")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS events_append_only()")
