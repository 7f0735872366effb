"""Storage shared by the proxy and the learner (SQLAlchemy 2; schema owned by Alembic)."""
