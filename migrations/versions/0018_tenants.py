"""tenants: teams whose calls are answered by LoRA adapters of their own

A tenant lists client keys and interaction types; the proxy sends its calls to its serving
adapter and records the tenant on each call; a policy version, and the step that made it, may
belong to a tenant's adapter lineage (store/tenants.py).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 23:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("client_keys", sa.JSON(), nullable=False),
        sa.Column("interaction_types", sa.JSON(), nullable=False),
        sa.Column("serving_version", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("tenant", sa.String(100), nullable=True))
    with op.batch_alter_table("policy_versions") as batch:
        batch.add_column(sa.Column("tenant", sa.String(100), nullable=True))
        batch.create_index("ix_policy_versions_tenant", ["tenant"])
    with op.batch_alter_table("training_steps") as batch:
        batch.add_column(sa.Column("tenant", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_steps") as batch:
        batch.drop_column("tenant")
    with op.batch_alter_table("policy_versions") as batch:
        batch.drop_index("ix_policy_versions_tenant")
        batch.drop_column("tenant")
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("tenant")
    op.drop_table("tenants")
