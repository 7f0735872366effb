"""turn_signals: how each assistant turn did by what came right after it, stored per turn

The learner stores the next-turn signals of every trajectory it grades (store/next_turn.py),
with the client key of the call judged, so the admin API can show them by key and flag a key
whose signals are one-sided (store/turn_signals.py).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 16:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "turn_signals",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("trajectory_id", sa.String(32), nullable=False),
        sa.Column("call_id", sa.String(32), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("rule", sa.String(32), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("key_name", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_turn_signals_trajectory_id", "turn_signals", ["trajectory_id"])
    op.create_index("ix_turn_signals_created_at", "turn_signals", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_turn_signals_created_at", table_name="turn_signals")
    op.drop_index("ix_turn_signals_trajectory_id", table_name="turn_signals")
    op.drop_table("turn_signals")
