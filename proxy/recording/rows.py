"""From logged calls to database rows: trajectories, prompt deltas, continuations.

A logged call (an "entry") is the plain-JSON form of a CallRecord (`entry_of`), the line the
call log holds. `RowBuilder` turns entries, in log order, into the rows one batch writes;
it owns the trajectory tracker, so it must see every entry exactly once, in order.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TypedDict

from proxy.base.record import CallEntry, CallRecord, CaptureEntry
from proxy.recording.interaction import type_of
from proxy.recording.stitching import (
    PrefixHasher,
    TrajectoryTracker,
    derive_task_key,
    new_id,
    token_array,
)
from store.call_rows import CallRow, FinishedRow, ResponseRow, TrajectoryRow
from store.json_types import JsonValue
from store.tokens import common_prefix_len


class Rows(TypedDict):
    """What one batch writes (store/recording.py `write_batch`)."""

    trajectories: list[TrajectoryRow]
    calls: list[CallRow]
    finished: list[FinishedRow]
    responses: list[ResponseRow]


FindOpen = Callable[[str], tuple[str, float, float] | None]


def empty_rows() -> Rows:
    return {"trajectories": [], "calls": [], "finished": [], "responses": []}


def entry_of(record: CallRecord) -> CallEntry:
    """The call as plain JSON data: everything the rows are built from.

    `chat_messages` is left out when it is the request's own `messages` (chat completions),
    so the conversation is not written twice.
    """
    capture = record.capture
    entry: CallEntry = {
        "id": record.id,
        "api": record.api,
        "session_key": record.session_key,
        "started_at": record.started_at,
        "latency_ms": record.latency_ms,
        "ttft_ms": record.ttft_ms,
        "stream": record.stream,
        "status": record.status,
        "http_status": record.http_status,
        "error": record.error,
        "task_key": record.task_key,
        "interaction_type": record.interaction_type,
        "group_key": record.group_key,
        "fanout_parent": record.fanout_parent,
        "upstream": record.upstream,
        "model": record.model,
        "policy_version": record.policy_version,
        "sampling": record.sampling,
        "request": record.request,
        "response": record.response,
        "capture": None,
        "user_agent": record.user_agent,
        "compat": record.compat.as_record() if record.compat is not None else None,
        "key_name": record.key_name,
        "tenant": record.tenant,
        "teacher": record.teacher,
    }
    if capture is not None:
        choices = capture.choices
        entry["capture"] = {
            "prompt_token_ids": capture.prompt_token_ids,
            "choices": [c.as_record() for c in choices],
            "reply": choices[0].message if choices else None,
            "prompt_tokens": capture.prompt_tokens,
            "completion_tokens": capture.completion_tokens,
            "complete": capture.complete,
        }
    messages = record.chat_messages
    request = record.request
    if messages is None or not isinstance(request, dict) or request.get("messages") is not messages:
        entry["chat_messages"] = messages
    if record.stored_response is not None:
        entry["stored_response"] = record.stored_response
    return entry


def chat_messages(entry: CallEntry) -> list[JsonValue] | None:
    if "chat_messages" in entry:
        return entry["chat_messages"]
    return entry["request"]["messages"]


def ended_at(entry: CallEntry) -> float:
    """When the call ended: idle time is measured from here, not from its start."""
    return float(entry["started_at"]) + (entry.get("latency_ms") or 0.0) / 1000.0


class RowBuilder:
    def __init__(self, tracker: TrajectoryTracker, find_open: FindOpen | None = None) -> None:
        self.tracker = tracker
        self.find_open = find_open

    def rows(self, entries: list[CallEntry]) -> Rows:
        trajectories: dict[str, TrajectoryRow] = {}
        rows = empty_rows()
        for entry in entries:
            if entry.get("fanout_parent") is not None:
                row, trajectory = sibling_row(entry)
            else:
                row, trajectory = self.call_row(entry)
            rows["calls"].append(row)
            if trajectory is not None:
                earlier = trajectories.get(trajectory["id"])
                if earlier is not None and earlier["new"]:
                    trajectory["new"] = True  # the batch's last word on it, but new all the same
                trajectories[trajectory["id"]] = trajectory
            stored = entry.get("stored_response")
            if stored is not None:
                rows["responses"].append({**stored, "call_id": entry["id"]})
        rows["trajectories"] = list(trajectories.values())
        return rows

    def call_row(self, entry: CallEntry) -> tuple[CallRow, TrajectoryRow | None]:
        messages = chat_messages(entry)
        capture = entry["capture"]
        session_key = entry["session_key"]
        if session_key is None and capture is None and messages is None:
            # a request refused before it reached a model belongs to no episode
            return bare_row(entry), None
        tracker = self.tracker
        started = entry["started_at"]
        # key-less calls only (a session needs no stitching): one running hash over the
        # messages, their prefixes to find what this call continues, then + the reply for
        # the continuation it offers
        hasher = PrefixHasher()
        keyless = session_key is None and messages is not None
        hashes = [hasher.add(m) for m in messages] if keyless else []
        state, is_new = tracker.resolve(
            session_key=session_key,
            messages=messages,
            now=started,
            find_open=self.find_open,
            hashes=hashes,
        )
        if is_new or state.task_key is None:
            state.task_key = entry["task_key"] or derive_task_key(messages)
        if state.interaction_type is None:
            # fixed by the trajectory's first call (or the first this process sees of a
            # session it found open in the database, where the stored one is kept)
            state.interaction_type = type_of(entry)
        if is_new and entry["group_key"] is not None:
            # a fan-out call joining a session's open trajectory leaves that one ungrouped
            state.group_key = entry["group_key"]
        prompt = capture["prompt_token_ids"] if capture else None
        parent_id, prefix_len, suffix = None, 0, prompt
        last_sequence = state.last_sequence
        # the prompt as the tracker keeps sequences (None: ids that are not 64-bit ints)
        sequence = None if prompt is None else token_array(prompt)
        if sequence is not None and state.last_call_id and last_sequence:
            prefix_len = common_prefix_len(last_sequence, sequence)
            if prefix_len:
                parent_id, suffix = state.last_call_id, prompt[prefix_len:]
        digest = None
        if entry["status"] != "ok":
            # a failed or cancelled call is retried with the same messages: the retry, not
            # this call, continues the conversation (and its partial reply is no reply)
            if tracker.taken is not None:
                tracker.give_back(tracker.taken, state)
        elif keyless and capture and capture["reply"] is not None:
            digest = hasher.add(capture["reply"])  # = continuation_hash(messages, reply)
            tracker.offer_continuation(digest, state)
        ended = ended_at(entry)
        if prompt is not None:
            choices = capture["choices"]
            completion = token_array(choices[0]["token_ids"] if choices else [])
            if sequence is None or completion is None:
                sequence = array("q")  # nothing to store the next prompt against
            else:
                sequence.extend(completion)
            tracker.touch(state, ended, entry["id"], sequence, answered=answered(entry, capture))
        else:
            tracker.touch(
                state, ended, state.last_call_id or "", last_sequence, answered(entry, capture)
            )
        row = call_columns(entry, state.id, parent_id, prefix_len, suffix, digest)
        trajectory: TrajectoryRow = {
            "id": state.id,
            "session_key": state.session_key,
            "task_key": text(state.task_key, 500),
            "group_key": state.group_key,
            "interaction_type": text(state.interaction_type, 200),
            "status": "open",
            "started_at": state.started_at,
            "last_call_at": state.last_call_at,
            "ended_at": None,
            "new": is_new,
        }
        return row, trajectory


def sibling_row(entry: CallEntry) -> tuple[CallRow, TrajectoryRow]:
    """A fan-out choice the client never saw: its own trajectory, finished at once.

    Nobody continues it (no continuation is offered, no session); its prompt is the
    client's call's prompt, stored as a reference to that call.
    """
    capture = entry["capture"]
    prompt = capture["prompt_token_ids"] if capture else None
    trajectory_id = new_id()
    row = call_columns(
        entry,
        trajectory_id,
        entry["fanout_parent"] if prompt else None,
        len(prompt) if prompt else 0,
        None if prompt is None else [],
        None,
    )
    ended = ended_at(entry)
    trajectory: TrajectoryRow = {
        "id": trajectory_id,
        "session_key": None,
        "task_key": entry["task_key"] or derive_task_key(chat_messages(entry)),
        "group_key": entry["group_key"],
        "interaction_type": text(type_of(entry), 200),
        "status": "finished",
        "started_at": entry["started_at"],
        "last_call_at": ended,
        "ended_at": ended,
        "new": True,
    }
    return row, trajectory


def bare_row(entry: CallEntry) -> CallRow:
    return {
        "id": entry["id"],
        "trajectory_id": None,
        "session_key": entry["session_key"],
        "api": entry["api"],
        "upstream": text(entry["upstream"], 500),
        "model": text(entry["model"], 500),
        "policy_version": entry["policy_version"],
        "stream": entry["stream"],
        "status": entry["status"],
        "http_status": entry["http_status"],
        "error": text(entry["error"]),
        "request": entry["request"],
        "response": entry["response"],
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
        "started_at": entry["started_at"],
        "latency_ms": entry["latency_ms"],
        "ttft_ms": entry["ttft_ms"],
        # absent from entries logged before these columns existed
        "user_agent": text(entry.get("user_agent"), 500),
        "compat": entry.get("compat"),
        "key_name": entry.get("key_name"),
        "tenant": entry.get("tenant"),
        "teacher": entry.get("teacher"),
        "sampling": entry.get("sampling"),
    }


def call_columns(
    entry: CallEntry,
    trajectory_id: str,
    parent_id: str | None,
    prefix_len: int,
    suffix: list[int] | None,
    digest: str | None,
) -> CallRow:
    """The row of a call that reached a model: its own columns, its capture's, and where it
    sits in its trajectory (built in one go: it runs for every call)."""
    capture = entry["capture"]
    if capture is None:
        row = bare_row(entry)
        row.update(
            trajectory_id=trajectory_id,
            prompt_parent_id=parent_id,
            prompt_prefix_len=prefix_len,
            prompt_token_suffix=suffix,
            continuation_hash=digest,
        )
        return row
    prompt = capture["prompt_token_ids"]
    choices = capture["choices"]
    return {
        "id": entry["id"],
        "trajectory_id": trajectory_id,
        "session_key": entry["session_key"],
        "api": entry["api"],
        "upstream": text(entry["upstream"], 500),
        "model": text(entry["model"], 500),
        "policy_version": entry["policy_version"],
        "stream": entry["stream"],
        "status": entry["status"],
        "http_status": entry["http_status"],
        "error": text(entry["error"]),
        "request": entry["request"],
        "response": entry["response"],
        "prompt_parent_id": parent_id,
        "prompt_prefix_len": prefix_len,
        "prompt_token_suffix": suffix,
        "prompt_len": None if prompt is None else len(prompt),
        "choices": choices,
        "finish_reason": choices[0]["finish_reason"] if choices else None,
        "prompt_tokens": capture["prompt_tokens"],
        "completion_tokens": capture["completion_tokens"],
        "capture_complete": bool(capture["complete"] and entry["status"] == "ok"),
        "continuation_hash": digest,
        "started_at": entry["started_at"],
        "latency_ms": entry["latency_ms"],
        "ttft_ms": entry["ttft_ms"],
        "user_agent": text(entry.get("user_agent"), 500),
        "compat": entry.get("compat"),
        "key_name": entry.get("key_name"),
        "tenant": entry.get("tenant"),
        "teacher": entry.get("teacher"),
        "sampling": entry.get("sampling"),
    }


def text(value: str | None, limit: int | None = None) -> str | None:
    """Text a database column takes: no NUL (PostgreSQL refuses it), within its length."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd")
    return value if limit is None else value[:limit]


def answered(entry: CallEntry, capture: CaptureEntry | None) -> bool:
    """The call ended with an answer: answered in full, no reply asking for a tool (vLLM's
    finish reason `tool_calls`, whatever API the client spoke). Then no harness is running
    a tool; only a next message from a person can continue the trajectory."""
    if entry["status"] != "ok" or capture is None or not capture["choices"]:
        return False
    return all(c.get("finish_reason") != "tool_calls" for c in capture["choices"])
