"""Read models of the projections: request_resources, audit findings, turn tables, and the
projection checkpoint (position + fold state written in the same transaction as the rows).

Revision ID: 0002_read_models
Revises: 0001_events
Create Date: 2026-11-30

Frozen history; matches ``projections.shell.readmodels``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_read_models"
down_revision = "0001_events"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projection_checkpoints",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("fold_version", sa.Integer, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.Column("updated_at_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "rm_request_resources",
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
    op.create_table(
        "rm_audit_findings",
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
    op.create_table(
        "rm_turn_tables",
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
    op.create_index("ix_rm_turn_tables_position", "rm_turn_tables", ["finalize_position"])


def downgrade() -> None:
    op.drop_index("ix_rm_turn_tables_position", "rm_turn_tables")
    for table in ("rm_turn_tables", "rm_audit_findings", "rm_request_resources", "projection_checkpoints"):
        op.drop_table(table)
