"""drop the call indexes no query uses

Every recorded call paid for them on the write path: `continuation_hash` (random keys, the
costliest to insert into; stitching is done in the proxy's memory), `status` (only ever
aggregated) and `trajectory_id` (`ix_calls_trajectory_started` leads with it).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 10:40:00
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

DROPPED = (
    ("ix_calls_continuation_hash", "continuation_hash"),
    ("ix_calls_status", "status"),
    ("ix_calls_trajectory_id", "trajectory_id"),
)


def upgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        for name, _ in DROPPED:
            batch_op.drop_index(name)


def downgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        for name, column in DROPPED:
            batch_op.create_index(name, [column], unique=False)
