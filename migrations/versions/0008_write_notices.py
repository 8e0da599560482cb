"""write notices: PostgreSQL notifies `shardline_writes` as a write to the tables the API's
read cache keeps answers from commits, whoever makes it (any API server, the CLI, a script
in psql), so every API server drops what it kept at once (service/write_notices.py).

SQLite has no notifications: nothing to do there.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What a cached read shows: a token's user, a job's status and the listing (with owners).
TABLES = ("users", "api_tokens", "jobs")
CHANNEL = "shardline_writes"  # service/write_notices.py listens on it


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # One notice per statement, delivered at commit; the same notice twice in a transaction
    # is delivered once, so a transaction that writes several rows costs one.
    op.execute(
        "CREATE FUNCTION shardline_notify_writes() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$"
    )
    for table in TABLES:
        op.execute(
            f"CREATE TRIGGER shardline_writes_{table} "
            f"AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION shardline_notify_writes()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP TRIGGER shardline_writes_{table} ON {table}")
    op.execute("DROP FUNCTION shardline_notify_writes()")
