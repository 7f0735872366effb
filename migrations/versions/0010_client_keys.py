"""client keys

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # keys clients present (only their SHA-256 is kept), and on every call the name of the
    # key it came with: whose traffic it is, what the learner can be limited to
    op.create_table(
        "client_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("client_keys", schema=None) as batch_op:
        batch_op.create_index(
            "ix_client_keys_active_name",
            ["name"],
            unique=True,
            postgresql_where=sa.text("revoked_at IS NULL"),
            sqlite_where=sa.text("revoked_at IS NULL"),
        )
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_name", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls", schema=None) as batch_op:
        batch_op.drop_column("key_name")
    with op.batch_alter_table("client_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_client_keys_active_name")
    op.drop_table("client_keys")
