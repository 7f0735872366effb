"""Responses-API responses the proxy keeps (`store: true`), for follow-ups and GET.

Recent ones are answered from memory, so a follow-up sent right after a response never
waits for the write buffer; older ones come from the database (written with the call's
record, through the same queue and spool).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from sqlalchemy import Engine

from proxy.base.record import StoredResponse
from store import recording
from store.call_rows import StoredResponseRow


class ResponseStore:
    def __init__(self, engine: Engine, *, capacity: int = 10_000) -> None:
        self.engine = engine
        self.capacity = capacity
        self._recent: OrderedDict[str, StoredResponse | StoredResponseRow] = OrderedDict()

    def remember(self, stored: StoredResponse) -> None:
        self._recent[stored["id"]] = stored
        self._recent.move_to_end(stored["id"])
        while len(self._recent) > self.capacity:
            self._recent.popitem(last=False)

    async def get(self, response_id: str) -> StoredResponse | StoredResponseRow | None:
        """{"id", "response", "conversation", ...} or None; raises SQLAlchemyError if the
        database is unreachable and the response is not in memory."""
        if response_id in self._recent:
            return self._recent[response_id]
        return await asyncio.to_thread(self._load, response_id)

    def _load(self, response_id: str) -> StoredResponseRow | None:
        with self.engine.connect() as conn:
            return recording.stored_response(conn, response_id=response_id)
