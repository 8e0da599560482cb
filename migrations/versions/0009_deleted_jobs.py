"""deleted_jobs: what is kept of a job its owner deleted (who, what, when), its own rows,
logs, metrics and checkpoints being gone

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deleted_jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("steps_trained", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_by_id", sa.Integer(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_deleted_jobs_owner_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["deleted_by_id"], ["users.id"], name=op.f("fk_deleted_jobs_deleted_by_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deleted_jobs")),
    )
    op.create_index(op.f("ix_deleted_jobs_owner_id"), "deleted_jobs", ["owner_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_deleted_jobs_owner_id"), table_name="deleted_jobs")
    op.drop_table("deleted_jobs")
