"""swap_requests: the admin API's rollback and promote, carried out by a running learner

The proxy process records the request; a learner claims it, swaps under the publish lease and
records the outcome (learner/swap/requests.py). So the proxy holds no swap code.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 17:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "swap_requests",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("version", sa.String(200), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("lease_wait", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(200), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("serving", sa.String(200), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_status", sa.Integer(), nullable=True),
    )
    op.create_index("ix_swap_requests_status", "swap_requests", ["status"])


def downgrade() -> None:
    op.drop_index("ix_swap_requests_status", table_name="swap_requests")
    op.drop_table("swap_requests")
