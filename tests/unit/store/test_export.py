"""The export format (a public interface) from the trajectory record and back (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from store.export import from_export, parse_export_time, to_export
from store.trajectory_record import Trajectory

CALL: dict[str, Any] = {
    "id": "c1",
    "api": "chat.completions",
    "model": "tiny",
    "upstream": "http://127.0.0.1:8000",
    "policy_version": "v1",
    "status": "ok",
    "http_status": 200,
    "error": None,
    "stream": True,
    "started_at": "2026-01-01T12:00:00+00:00",
    "request": {"messages": [{"role": "user", "content": "hi"}], "n": 2},
    "response": {"choices": [{"message": {"role": "assistant", "content": "yo"}}]},
    "prompt_token_ids": [1, 2],
    "completion_token_ids": [3],
    "completion_logprobs": [-0.5],
    "finish_reason": "stop",
    "capture_complete": True,
    "latency_ms": 12.5,
    "ttft_ms": 3.0,
    "user_agent": "curl/8",
    "compat": None,
    "key_name": "ci",
    "tenant": None,
    "teacher": None,
    "sampling": {"temperature": 1.0},
    "choices": [{"index": 0, "token_ids": [3]}, {"index": 1, "token_ids": [4]}],
}
ROW: dict[str, Any] = {
    "id": "t1",
    "session": "s",
    "task_key": "k",
    "group_key": "fanout:c1",
    "interaction_type": "qa",
    "status": "finished",
    "reward": 0.5,
    "started_at": "2026-01-01T12:00:00+00:00",
    "ended_at": None,
    "calls": [CALL],
}


def test_a_row_comes_back_field_for_field_and_in_order() -> None:
    back = to_export(from_export(ROW))
    assert back == ROW
    assert list(back) == list(ROW) and list(back["calls"][0]) == list(CALL)


def test_choices_are_listed_only_where_a_call_had_several() -> None:
    single = {k: v for k, v in CALL.items() if k != "choices"}
    assert "choices" not in to_export(from_export({**ROW, "calls": [single]}))["calls"][0]


def test_what_a_hand_written_row_leaves_out_takes_the_default() -> None:
    trajectory = from_export({"id": "t", "calls": [{"id": "c", "prompt_token_ids": [1]}]})
    assert trajectory.status == "finished" and trajectory.started_at is None
    (call,) = trajectory.calls
    assert (call.api, call.status, call.prompt_token_ids, call.sampling) == ("", "ok", [1], None)


def test_times_are_utc_with_an_offset() -> None:
    noon = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert to_export(Trajectory("t", started_at=noon))["started_at"] == ROW["started_at"]
    assert parse_export_time("2026-01-01T12:00:00Z") == noon
    assert parse_export_time("2026-01-01T12:00:00") == noon  # naive means UTC
    assert parse_export_time(None) is None
