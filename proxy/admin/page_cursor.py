"""The trajectory list's page cursor: where the last page ended, opaque to clients."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

import orjson

from proxy.admin.errors import AdminError
from store.clock import iso


def encode_cursor(started_at: datetime, trajectory_id: str) -> str:
    raw = orjson.dumps([iso(started_at), trajectory_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        started, trajectory_id = orjson.loads(raw)
        when = datetime.fromisoformat(started.replace("Z", "+00:00"))
        if not isinstance(trajectory_id, str):
            raise TypeError("id")
    except (binascii.Error, ValueError, TypeError, AttributeError, orjson.JSONDecodeError):
        raise AdminError(400, "cursor is not one this API gave out", param="cursor") from None
    return when, trajectory_id
