"""call user agent and compat

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the harness behind each call, and what the compatibility policy did with it: what an
    # operator sees per harness in the admin API (GET /admin/api/compat)
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("user_agent", sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column("compat", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_column("compat")
        batch_op.drop_column("user_agent")
