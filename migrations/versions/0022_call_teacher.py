"""call teacher: which teacher answered a call instead of the served policy

A proxy may send some traffic to a stronger upstream (`serve --teacher-url`); its calls are
recorded as usual, with the teacher's name here and no policy version, so the learner
trains the served model on them supervised and never counts them as its own samples.
NULL: the served policy answered.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-08 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("teacher", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("teacher")
