"""curricula: their current stage, their evals and their promotions

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # `onthejob rollout --curriculum` (learner/rollout/curriculum_runner.py): where each
    # curriculum stands, so a restart resumes at the recorded stage
    op.create_table(
        "curricula",
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("stages", sa.JSON(), nullable=False),
        sa.Column("stage", sa.String(length=80), nullable=True),
        sa.Column("stage_index", sa.Integer(), nullable=True),
        sa.Column("stage_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stage_rounds", sa.Integer(), nullable=False),
        sa.Column("last_eval_round", sa.Integer(), nullable=True),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "curriculum_evals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("curriculum", sa.String(length=80), nullable=False),
        sa.Column("stage", sa.String(length=80), nullable=False),
        sa.Column("rollout_id", sa.String(length=32), nullable=False),
        sa.Column("policy_version", sa.String(length=200), nullable=True),
        sa.Column("stage_round", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("pass_at_1", sa.Float(), nullable=True),
        sa.Column("mean_reward", sa.Float(), nullable=True),
        sa.Column("pass_at_k", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("curriculum_evals", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_curriculum_evals_curriculum"), ["curriculum"], unique=False
        )
    op.create_table(
        "curriculum_promotions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("curriculum", sa.String(length=80), nullable=False),
        sa.Column("from_stage", sa.String(length=80), nullable=False),
        sa.Column("to_stage", sa.String(length=80), nullable=True),
        sa.Column("policy_version", sa.String(length=200), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("curriculum_promotions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_curriculum_promotions_curriculum"), ["curriculum"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("curriculum_promotions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_curriculum_promotions_curriculum"))
    op.drop_table("curriculum_promotions")
    with op.batch_alter_table("curriculum_evals", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_curriculum_evals_curriculum"))
    op.drop_table("curriculum_evals")
    op.drop_table("curricula")
