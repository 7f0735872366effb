"""watch_alerts: the reward-hacking watch's alerts on a canary's candidate or a new version

Each row is one detector alerting on a version against the one it is compared with, from
the look that raised it to the look that no longer finds it (store/watch_alerts.py); an
alert on a canary's candidate holds its promotion.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "watch_alerts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("canary_id", sa.Integer(), sa.ForeignKey("canaries.id"), nullable=True),
        sa.Column("scope", sa.String(100), nullable=False),
        sa.Column("version", sa.String(200), nullable=False),
        sa.Column("baseline", sa.String(200), nullable=True),
        sa.Column("detector", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raised_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_watch_alerts_canary_id", "watch_alerts", ["canary_id"])
    op.create_index("ix_watch_alerts_cleared_at", "watch_alerts", ["cleared_at"])


def downgrade() -> None:
    op.drop_index("ix_watch_alerts_cleared_at", table_name="watch_alerts")
    op.drop_index("ix_watch_alerts_canary_id", table_name="watch_alerts")
    op.drop_table("watch_alerts")
