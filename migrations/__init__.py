"""Alembic's schema history for SQLite and PostgreSQL (env.py and versions/).

A package so that the wheel carries it and `service/migrate.py` finds it from an installed
copy in any working directory.
"""
