"""store.identity.public_url: what a proxy may say about its store."""

from __future__ import annotations

from pathlib import Path

from store.identity import public_url


def test_the_password_never_leaves_and_sqlite_paths_are_absolute() -> None:
    shown = public_url("postgresql://learner:s3cret@db.internal:5432/onthejob")
    assert shown == "postgresql+psycopg://learner:***@db.internal:5432/onthejob"
    assert "s3cret" not in shown
    assert public_url("sqlite:///onthejob.db") == f"sqlite:///{Path('onthejob.db').resolve()}"
    assert public_url("sqlite:////var/lib/x.db") == "sqlite:////var/lib/x.db"
