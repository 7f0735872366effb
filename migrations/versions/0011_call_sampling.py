"""call sampling

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the sampling parameters vLLM applied to each call (the request's, else the replica's
    # defaults): what the learner reproduces when it recomputes the call's logprobs
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sampling", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_column("sampling")
