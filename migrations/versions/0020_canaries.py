"""canaries: a new version serving a share of live traffic beside the serving one

A canary runs per scope (a tenant, or "*" for the shared policy), at most one at a time;
the proxies send its candidate a share of the scope's sessions, and every action on it
(start, extend, promote, rollback) is kept with who took it (store/canaries.py).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "canaries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(100), nullable=False),
        sa.Column("candidate", sa.String(200), nullable=False),
        sa.Column("incumbent", sa.String(200), nullable=True),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("min_calls", sa.Integer(), nullable=False),
        sa.Column("default_decision", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_by", sa.String(200), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_by", sa.String(200), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_canaries_status", "canaries", ["status"])
    # one running canary per scope: a call's scope has one candidate
    op.create_index(
        "ix_canaries_running_scope",
        "canaries",
        ["scope"],
        unique=True,
        postgresql_where=sa.text("status = 'running'"),
        sqlite_where=sa.text("status = 'running'"),
    )
    op.create_table(
        "canary_actions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("canary_id", sa.Integer(), sa.ForeignKey("canaries.id"), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("by", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
    )
    op.create_index("ix_canary_actions_canary_id", "canary_actions", ["canary_id"])


def downgrade() -> None:
    op.drop_index("ix_canary_actions_canary_id", table_name="canary_actions")
    op.drop_table("canary_actions")
    op.drop_index("ix_canaries_running_scope", table_name="canaries")
    op.drop_index("ix_canaries_status", table_name="canaries")
    op.drop_table("canaries")
