"""ix_jobs_owner_created: a user's listing, newest first, read from the index

Without it, listing a user's jobs sorted all of them (a temporary B-tree) on every page.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_owner_created", "jobs", ["owner_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_created", table_name="jobs")
