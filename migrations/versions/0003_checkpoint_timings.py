"""checkpoints.save_s, checkpoints.blocking_s: how long a save took and held training

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.add_column(sa.Column("save_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("blocking_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch_op:
        batch_op.drop_column("blocking_s")
        batch_op.drop_column("save_s")
