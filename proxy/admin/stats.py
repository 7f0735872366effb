"""The statistics endpoints' time window, checked (store/traffic_stats.py aggregates)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from proxy.admin.errors import AdminError

MAX_BUCKETS = 2000


def window(
    since: datetime | None, until: datetime | None, bucket: str
) -> tuple[datetime, datetime]:
    until = until or datetime.now(UTC)
    since = since or until - (timedelta(hours=24) if bucket == "hour" else timedelta(days=30))
    if since >= until:
        raise AdminError(400, "since must be before until", param="since")
    size = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    if (until - since) / size > MAX_BUCKETS:
        raise AdminError(
            400, f"window too long for {bucket} buckets (at most {MAX_BUCKETS})", param="since"
        )
    return since, until
