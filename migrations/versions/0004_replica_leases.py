"""Replica leases (issue 14): one row per engine replica (stable id), renewed in place — not
part of the append-only log — and a partial index over the session lifecycle events
(SessionOpened, SessionTakenOver, SessionClosed) so a replica finds a dead replica's open
sessions without scanning the log.

Revision ID: 0004_replica_leases
Revises: 0002_read_models (re-pointed at merge time when 0003 lands)
Create Date: 2026-12-01

Frozen history; matches ``events.store.leases`` and ``events.store.owners``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_replica_leases"
down_revision = "0003_hash_chain"
branch_labels = None
depends_on = None

LIFECYCLE = "type IN ('SessionOpened', 'SessionTakenOver', 'SessionClosed')"


def upgrade() -> None:
    op.create_table(
        "replica_leases",
        sa.Column("replica_id", sa.Text, primary_key=True),
        sa.Column("incarnation", sa.BigInteger, nullable=False),
        sa.Column("engine_pool", sa.Text),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.BigInteger, nullable=False),
        sa.Column("lease_us", sa.BigInteger, nullable=False),
        sa.Column("acquired_at_us", sa.BigInteger, nullable=False),
        sa.Column("renewed_at_us", sa.BigInteger, nullable=False),
        sa.Column("expires_at_us", sa.BigInteger, nullable=False),
        sa.Column("released_at_us", sa.BigInteger),
        sa.Column("reaped_at_us", sa.BigInteger),
        sa.Column("reaped_by", sa.Text),
    )
    op.create_index(
        "ix_events_lifecycle",
        "events",
        ["position"],
        sqlite_where=sa.text(LIFECYCLE),
        postgresql_where=sa.text(LIFECYCLE),
    )


def downgrade() -> None:
    op.drop_index("ix_events_lifecycle", "events")
    op.drop_table("replica_leases")
