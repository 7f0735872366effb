"""version pins and deleted checkpoints

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # checkpoint retention (learner/retention.py): what an operator keeps whatever happens,
    # and when a version's checkpoint was deleted (it cannot serve again)
    with op.batch_alter_table("policy_versions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("pinned", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch_op.add_column(
            sa.Column("checkpoint_deleted_at", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("policy_versions", schema=None) as batch_op:
        batch_op.drop_column("checkpoint_deleted_at")
        batch_op.drop_column("pinned")
