"""The store's clock: timezone-aware UTC, as every timestamp column holds it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload


def now() -> datetime:
    return datetime.now(UTC)


@overload
def as_utc(value: datetime) -> datetime: ...
@overload
def as_utc(value: None) -> None: ...
def as_utc(value: datetime | None) -> datetime | None:
    """A stored timestamp as UTC-aware: SQLite hands them back naive, and they are stored
    as UTC; an aware one is returned as it is."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def iso(value: datetime | None) -> str | None:
    """A stored timestamp as ISO 8601 in UTC with a Z, as the admin API gives them."""
    if value is None:
        return None
    return as_utc(value).astimezone(UTC).isoformat().replace("+00:00", "Z")
