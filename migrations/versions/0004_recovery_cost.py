"""jobs.steps_lost, jobs.seconds_lost: what recoveries cost a job, for goodput

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(
            sa.Column("steps_lost", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("seconds_lost", sa.Float(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("seconds_lost")
        batch_op.drop_column("steps_lost")
