"""Alembic migrations: the only place the schema is created or changed."""
