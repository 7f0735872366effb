"""trajectories.interaction_type: what kind of interaction a trajectory is

From the X-Onthejob-Type header of its first call, else a fingerprint of that call's
harness, system prompt and tool set (proxy/recording/interaction.py). Indexed: the admin API, the
export and the per-type figures filter and group by it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 22:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trajectories", sa.Column("interaction_type", sa.String(200), nullable=True))
    op.create_index("ix_trajectories_interaction_type", "trajectories", ["interaction_type"])


def downgrade() -> None:
    op.drop_index("ix_trajectories_interaction_type", table_name="trajectories")
    # a plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35 has it): a batch operation would
    # copy the table, which the calls' foreign key into it refuses on SQLite
    op.drop_column("trajectories", "interaction_type")
