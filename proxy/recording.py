"""The write buffer: records leave the response path through an in-memory queue.

A background task drains the queue in batches; one writer thread assigns trajectories,
stores prompts as deltas against the trajectory's previous call, and writes the batch. If
the database is unreachable the batch goes to the spool file, which is replayed (before any
newer batch) as soon as the database answers again, and at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from proxy.capture import Capture
from proxy.spool import Spool
from proxy.stitching import TrajectoryTracker, continuation_hash, derive_task_key, new_id
from proxy.store import repo
from proxy.store.tokens import common_prefix_len, first_completion

log = logging.getLogger("onthejob.recording")


@dataclass
class CallRecord:
    """Everything known about one call; filled in along the request, then enqueued."""

    id: str
    api: str
    session_key: str | None
    started_at: float
    stream: bool = False
    status: str = "ok"
    http_status: int = 200
    error: str | None = None
    request: dict[str, Any] | None = None
    response: Any = None
    # the conversation as chat messages (translated for Responses/Messages): for stitching
    chat_messages: list[Any] | None = None
    # a Responses-API response to keep: {"id", "created_at", "response", "conversation"}
    stored_response: dict[str, Any] | None = None
    # explicit task key (X-Onthejob-Task); else derived from the first user message
    task_key: str | None = None
    # per-call working state of the client API's dialect (never stored)
    context: dict[str, Any] = field(default_factory=dict)
    upstream: str | None = None
    model: str | None = None
    policy_version: str | None = None
    capture: Capture | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    # fan-out: the GRPO group of this call's choice. A sibling -- a choice sampled for the
    # client's call but not returned -- names that call in `fanout_parent`; it gets its own
    # trajectory, finished at once, and its prompt is stored by reference to that call.
    group_key: str | None = None
    fanout_parent: str | None = None


class Recorder:
    def __init__(
        self,
        engine: Engine,
        spool: Spool,
        *,
        idle_timeout: float,
        flush_interval: float,
        batch_size: int,
    ) -> None:
        self.engine = engine
        self.spool = spool
        self.tracker = TrajectoryTracker(idle_timeout)
        self.idle_timeout = idle_timeout
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self._queue: list[CallRecord] = []
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recorder")
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._db_retry_at = 0.0
        self._last_sweep = 0.0
        self.written = 0
        self.spooled = 0
        self.rejected = 0
        self.rejected_path = spool.path.with_name(spool.path.name + ".rejected")

    # -- request path --------------------------------------------------------------------
    def record(self, call: CallRecord) -> None:
        """Accept a record; never blocks and never raises."""
        self._queue.append(call)
        if len(self._queue) >= self.batch_size:
            self._wakeup.set()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # records left in the spool by an earlier run go in first
        await loop.run_in_executor(self._executor, self._replay_spool)
        self._task = asyncio.create_task(self._run(), name="recorder")

    async def close(self) -> None:
        """Flush everything still queued (to the database or the spool)."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=self.flush_interval)
            except TimeoutError:
                pass
            self._wakeup.clear()
            batch, self._queue = self._queue, []
            try:
                await loop.run_in_executor(self._executor, self._flush, batch)
            except Exception as exc:  # never let the writer die: it is the only one
                log.exception("recorder flush failed; %d records set aside", len(batch))
                await loop.run_in_executor(self._executor, self._set_aside, batch, exc)
            if self._closing and not self._queue:
                return

    # -- writer thread -------------------------------------------------------------------
    def _flush(self, batch: list[CallRecord]) -> None:
        now = time.time()
        rows = self._rows(batch, now)
        if now - self._last_sweep >= min(self.idle_timeout, 5.0) / 2:
            self._last_sweep = now
            rows["finished"] = [
                {"id": state.id, "ended_at": state.last_call_at}
                for state in self.tracker.expire(now)
            ]
        if not any(rows.values()) and not self.spool.size():
            return
        if time.monotonic() < self._db_retry_at:
            self._to_spool(rows)
            return
        try:
            self._replay_spool(raise_errors=True)
            self._write(rows, fresh=True)
            if rows["finished"]:
                cutoff = now - self.idle_timeout - 10 * self.flush_interval - 5
                with self.engine.begin() as conn:
                    repo.finish_idle(conn, idle_before=datetime.fromtimestamp(cutoff, UTC))
        except Unreachable as exc:
            log.warning("database unreachable (%s); spooling %d calls", exc, len(batch))
            self._db_retry_at = time.monotonic() + 1.0
            self._to_spool(rows)

    def _write(self, rows: dict[str, list[dict[str, Any]]], *, fresh: bool) -> None:
        """Write a batch; a row the database refuses is set aside, never blocks the rest.

        Raises Unreachable when the database cannot be reached (the caller spools).
        """
        try:
            with self.engine.begin() as conn:
                repo.write_batch(conn, **rows, fresh=fresh)
            self.written += len(rows.get("calls", []))
            return
        except Exception as exc:
            if _unreachable(exc):
                raise Unreachable(_short(exc)) from exc
            log.error("database refused a batch (%s); writing its rows one by one", _short(exc))
        for single in _singles(rows):
            try:
                with self.engine.begin() as conn:
                    repo.write_batch(conn, **single)
                self.written += len(single.get("calls", []))
            except Exception as exc:
                if _unreachable(exc):
                    raise Unreachable(_short(exc)) from exc
                self._reject(single, exc)

    def _set_aside(self, batch: list[CallRecord], exc: BaseException) -> None:
        """Records whose rows could not even be built: kept, without their trajectory."""
        calls = []
        for record in batch:
            try:
                calls.append(self._bare_row(record))
            except Exception:  # a record we cannot describe at all is only counted
                log.exception("record %s could not be kept", record.id)
        self._reject({"trajectories": [], "calls": calls, "finished": [], "responses": []}, exc)

    def _reject(self, rows: dict[str, list[dict[str, Any]]], exc: BaseException) -> None:
        """Keep a refused row beside the spool (not replayed) and say so loudly."""
        Spool(self.rejected_path).append({"error": _short(exc), "rows": rows})
        self.rejected += len(rows.get("calls", [])) or len(rows.get("trajectories", []))
        log.error("database refused a row (%s); kept in %s", _short(exc), self.rejected_path)

    def _to_spool(self, rows: dict[str, list[dict[str, Any]]]) -> None:
        if any(rows.values()):
            self.spool.append(rows)
            self.spooled += len(rows["calls"])

    def _replay_spool(self, raise_errors: bool = False) -> None:
        batches = self.spool.batches()
        if not batches:
            return
        try:
            for rows in batches:
                self._write(rows, fresh=False)  # may be in already: idempotent inserts
        except Unreachable as exc:
            if raise_errors:
                raise
            log.warning("spool replay deferred: database unreachable (%s)", exc)
            return
        self.spool.clear()
        replayed = sum(len(b.get("calls", [])) for b in batches)
        log.info("replayed %d spooled calls into the database", replayed)

    def _rows(self, batch: list[CallRecord], now: float) -> dict[str, list[dict[str, Any]]]:
        trajectories: dict[str, dict[str, Any]] = {}
        calls = []
        responses = []
        for record in batch:
            if record.fanout_parent is not None:
                row, trajectory = self._sibling_row(record)
            else:
                row, trajectory = self._call_row(record)
            calls.append(row)
            if trajectory is not None:
                trajectories[trajectory["id"]] = trajectory
            if record.stored_response is not None:
                responses.append({**record.stored_response, "call_id": record.id})
        return {
            "trajectories": list(trajectories.values()),
            "calls": calls,
            "finished": [],
            "responses": responses,
        }

    def _find_open(self, session_key: str) -> tuple[str, float, float] | None:
        """A session's open trajectory from the database (after a restart), if reachable."""
        if time.monotonic() < self._db_retry_at:
            return None
        try:
            with self.engine.connect() as conn:
                found = repo.open_trajectory_for_session(conn, session_key=session_key)
        except SQLAlchemyError:
            self._db_retry_at = time.monotonic() + 1.0
            return None
        if found is None:
            return None
        return (found["id"], _epoch(found["started_at"]), _epoch(found["last_call_at"]))

    def _call_row(self, record: CallRecord) -> tuple[dict[str, Any], dict[str, Any] | None]:
        messages = record.chat_messages
        capture = record.capture
        if record.session_key is None and capture is None and messages is None:
            # a request refused before it reached a model belongs to no episode
            return self._bare_row(record), None
        state, is_new = self.tracker.resolve(
            session_key=record.session_key,
            messages=messages,
            now=record.started_at,
            find_open=self._find_open,
        )
        if is_new or state.task_key is None:
            state.task_key = record.task_key or derive_task_key(messages)
        if is_new and record.group_key is not None:
            # a fan-out call joining a session's open trajectory leaves that one ungrouped
            state.group_key = record.group_key
        prompt = capture.prompt_token_ids if capture else None
        choices = [c.as_record() for c in capture.choices] if capture else None
        parent_id, prefix_len, suffix = None, 0, prompt
        if prompt is not None and state.last_call_id and state.last_sequence:
            prefix_len = common_prefix_len(state.last_sequence, prompt)
            if prefix_len:
                parent_id, suffix = state.last_call_id, prompt[prefix_len:]
        digest = None
        if record.status != "ok":
            # a failed or cancelled call is retried with the same messages: the retry, not
            # this call, continues the conversation (and its partial reply is no reply)
            if self.tracker.taken is not None:
                self.tracker.give_back(self.tracker.taken, state)
        elif capture and capture.choices and messages is not None:
            digest = continuation_hash(messages, capture.choices[0].message)
            self.tracker.offer_continuation(digest, state)
        if prompt is not None:
            self.tracker.touch(
                state, record.started_at, record.id, prompt + first_completion(choices)
            )
        else:
            self.tracker.touch(
                state, record.started_at, state.last_call_id or "", state.last_sequence
            )
        row = (
            self._bare_row(record)
            | _capture_columns(record)
            | {
                "trajectory_id": state.id,
                "prompt_parent_id": parent_id,
                "prompt_prefix_len": prefix_len,
                "prompt_token_suffix": suffix,
                "continuation_hash": digest,
            }
        )
        trajectory = {
            "id": state.id,
            "session_key": state.session_key,
            "task_key": _text(state.task_key, 500),
            "group_key": state.group_key,
            "status": "open",
            "started_at": state.started_at,
            "last_call_at": state.last_call_at,
            "ended_at": None,
        }
        return row, trajectory

    @staticmethod
    def _sibling_row(record: CallRecord) -> tuple[dict[str, Any], dict[str, Any]]:
        """A fan-out choice the client never saw: its own trajectory, finished at once.

        Nobody continues it (no continuation is offered, no session); its prompt is the
        client's call's prompt, stored as a reference to that call.
        """
        prompt = record.capture.prompt_token_ids if record.capture else None
        trajectory_id = new_id()
        row = (
            Recorder._bare_row(record)
            | _capture_columns(record)
            | {
                "trajectory_id": trajectory_id,
                "prompt_parent_id": record.fanout_parent if prompt else None,
                "prompt_prefix_len": len(prompt) if prompt else 0,
                "prompt_token_suffix": None if prompt is None else [],
            }
        )
        trajectory = {
            "id": trajectory_id,
            "session_key": None,
            "task_key": record.task_key or derive_task_key(record.chat_messages),
            "group_key": record.group_key,
            "status": "finished",
            "started_at": record.started_at,
            "last_call_at": record.started_at,
            "ended_at": record.started_at,
        }
        return row, trajectory

    @staticmethod
    def _bare_row(record: CallRecord) -> dict[str, Any]:
        return {
            "id": record.id,
            "trajectory_id": None,
            "session_key": record.session_key,
            "api": record.api,
            "upstream": _text(record.upstream, 500),
            "model": _text(record.model, 500),
            "policy_version": record.policy_version,
            "stream": record.stream,
            "status": record.status,
            "http_status": record.http_status,
            "error": _text(record.error),
            "request": record.request,
            "response": record.response,
            "prompt_parent_id": None,
            "prompt_prefix_len": 0,
            "prompt_token_suffix": None,
            "prompt_len": None,
            "choices": None,
            "finish_reason": None,
            "prompt_tokens": None,
            "completion_tokens": None,
            "capture_complete": False,
            "continuation_hash": None,
            "started_at": record.started_at,
            "latency_ms": record.latency_ms,
            "ttft_ms": record.ttft_ms,
        }


def _capture_columns(record: CallRecord) -> dict[str, Any]:
    """The call columns that come from its token capture."""
    capture = record.capture
    prompt = capture.prompt_token_ids if capture else None
    return {
        "prompt_len": None if prompt is None else len(prompt),
        "choices": [c.as_record() for c in capture.choices] if capture else None,
        "finish_reason": capture.choices[0].finish_reason if capture and capture.choices else None,
        "prompt_tokens": capture.prompt_tokens if capture else None,
        "completion_tokens": capture.completion_tokens if capture else None,
        "capture_complete": bool(capture and capture.complete and record.status == "ok"),
    }


def _text(value: str | None, limit: int | None = None) -> str | None:
    """Text a database column takes: no NUL (PostgreSQL refuses it), within its length."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd")
    return value if limit is None else value[:limit]


class Unreachable(Exception):
    """The database could not be reached (as opposed to refusing a row)."""


def _unreachable(exc: BaseException) -> bool:
    """Connection-level failures; anything else is about the data being written."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | OSError)


def _singles(rows: dict[str, list[dict[str, Any]]]) -> list[dict[str, list[dict[str, Any]]]]:
    """A batch split into one-row batches; trajectories first (calls refer to them)."""
    empty: dict[str, list[dict[str, Any]]] = {
        "trajectories": [],
        "calls": [],
        "finished": [],
        "responses": [],
    }
    out = []
    for key in ("trajectories", "calls", "responses", "finished"):
        out += [{**empty, key: [row]} for row in rows.get(key, [])]
    return out


def _epoch(value: datetime) -> float:
    if value.tzinfo is None:  # SQLite hands back naive datetimes; we store UTC
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
