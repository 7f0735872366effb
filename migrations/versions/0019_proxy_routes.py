"""proxy_instances.routes: the tenants' adapters each proxy routes to

A proxy reports, with its heartbeat, the tenants whose calls it sends to their serving
adapter (every replica it routes to has it loaded), so the learner knows when a tenant's
new adapter answers that tenant's calls everywhere (store/gates.py).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 02:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("proxy_instances") as batch:
        batch.add_column(sa.Column("routes", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("proxy_instances") as batch:
        batch.drop_column("routes")
