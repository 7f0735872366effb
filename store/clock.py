"""The store's clock: timezone-aware UTC, as every timestamp column holds it."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)
