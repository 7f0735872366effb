"""tenant canary settings: a tenant's own canary share, minimum, time limit, default
decision and watch thresholds, each over the learner's (learn --canary-*)

NULL, or a setting left out: the learner's. The learner reads them when it starts a canary
of one of the tenant's versions, and the watch's thresholds at every look
(learner/canary/settings.py).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-09 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("canary", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("canary")
