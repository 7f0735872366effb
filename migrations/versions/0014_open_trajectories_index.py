"""an index of the open trajectories by last call, in place of the index on status

The writer's sweep finishes open trajectories idle past the timeout (`repo.finish_idle`:
status = 'open' AND last_call_at < cutoff). On the index of last_call_at alone that range
holds every finished trajectory before the cutoff too, and on the index of status the
sweep visits every open one, so either way each sweep cost more as the table grew; the
partial index holds the open ones only, in the order the sweep wants them. The index of
status goes: the other queries ask for 'finished' (nearly every row: no use for an index)
or for 'open' (this index serves them).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 18:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

OPEN = sa.text("status = 'open'")


def upgrade() -> None:
    op.create_index(
        "ix_trajectories_open_last_call",
        "trajectories",
        ["last_call_at"],
        postgresql_where=OPEN,
        sqlite_where=OPEN,
    )
    op.drop_index("ix_trajectories_status", table_name="trajectories")


def downgrade() -> None:
    op.create_index("ix_trajectories_status", "trajectories", ["status"])
    op.drop_index("ix_trajectories_open_last_call", table_name="trajectories")
