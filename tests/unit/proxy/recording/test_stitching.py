"""proxy.recording.stitching: which trajectory a call belongs to."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.recording.stitching import (
    TrajectoryTracker,
    continuation_hash,
    normalise_message,
    prefix_hashes,
)

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is 2+2?"}
REPLY = {"role": "assistant", "content": "4"}
NEXT = {"role": "user", "content": "And 3+3?"}


def _call(call_id: str, name: str = "add", arguments: str = '{"a": 2}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- normalise_message ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [None, "", [], [{"type": "text", "text": ""}], [{"type": "image_url", "image_url": {}}]],
    ids=repr,
)
def test_empty_contents_are_equal(content: Any) -> None:
    assert normalise_message({"role": "assistant", "content": content}) == normalise_message(
        {"role": "assistant", "content": None}
    )


def test_text_part_lists_equal_plain_text() -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]

    assert normalise_message({"role": "user", "content": parts}) == {
        "role": "user",
        "content": "Hello",
    }


def test_extra_keys_and_tool_call_ids_are_ignored() -> None:
    sent = {"role": "assistant", "content": None, "tool_calls": [_call("call_1")]}
    echoed = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "reasoning": "thinking",
        "reasoning_content": "thinking",
        "tool_calls": [{**_call("call_XYZ"), "index": 0}],
    }

    assert normalise_message(sent) == normalise_message(echoed)
    assert normalise_message(sent) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [["add", {"a": 2}]],
    }


@pytest.mark.parametrize(
    "other",
    [
        {"role": "assistant", "content": None, "tool_calls": [_call("c", arguments='{"a": 3}')]},
        {"role": "assistant", "content": None, "tool_calls": [_call("c", name="sub")]},
        {"role": "assistant", "content": None, "tool_calls": [_call("c"), _call("d")]},
        {"role": "assistant", "content": "x", "tool_calls": [_call("c")]},
        {"role": "user", "content": None, "tool_calls": [_call("c")]},
    ],
    ids=["arguments", "name", "extra call", "content", "role"],
)
def test_what_counts_in_a_message_is_compared(other: dict[str, Any]) -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [_call("c")]}

    assert normalise_message(message) != normalise_message(other)


def test_tool_call_id_of_a_tool_result_is_kept() -> None:
    first = {"role": "tool", "tool_call_id": "call_1", "content": "4"}
    second = {"role": "tool", "tool_call_id": "call_2", "content": "4"}

    assert normalise_message(first)["tool_call_id"] == "call_1"
    assert normalise_message(first) != normalise_message(second)


def test_non_dict_message_passes_through() -> None:
    assert normalise_message("hello") == "hello"


# -- prefix_hashes / continuation_hash -----------------------------------------------------


def test_prefix_hashes_identify_each_prefix() -> None:
    messages = [SYSTEM, USER, REPLY, NEXT]

    hashes = prefix_hashes(messages)

    assert len(hashes) == 4
    assert len(set(hashes)) == 4
    assert hashes == [prefix_hashes(messages[: i + 1])[-1] for i in range(4)]


def test_message_boundaries_count() -> None:
    one = [{"role": "user", "content": "ab"}]
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]

    assert prefix_hashes(one)[-1] != prefix_hashes(two)[-1]


def test_continuation_hash_is_the_hash_of_messages_plus_reply() -> None:
    messages = [SYSTEM, USER]

    assert continuation_hash(messages, REPLY) == prefix_hashes([*messages, REPLY])[-1]
    assert continuation_hash(messages, REPLY) == prefix_hashes([*messages, REPLY, NEXT])[2]


def test_continuation_hash_matches_a_normalised_echo() -> None:
    reply = {"role": "assistant", "content": None, "tool_calls": [_call("call_1")]}
    echoed = {"role": "assistant", "content": "", "tool_calls": [_call("call_abc")]}

    assert continuation_hash([USER], reply) == prefix_hashes([USER, echoed])[-1]


def test_continuation_hash_of_no_reply_is_none() -> None:
    assert continuation_hash([USER], None) is None


# -- TrajectoryTracker ---------------------------------------------------------------------


def test_same_session_is_the_same_trajectory() -> None:
    tracker = TrajectoryTracker(idle_timeout=60)

    first, first_new = tracker.resolve(session_key="s1", messages=[USER], now=0)
    again, again_new = tracker.resolve(session_key="s1", messages=[NEXT], now=5)

    assert (first_new, again_new) == (True, False)
    assert again is first
    assert first.session_key == "s1"


def test_different_sessions_are_different_trajectories() -> None:
    tracker = TrajectoryTracker(idle_timeout=60)

    one, _ = tracker.resolve(session_key="s1", messages=[USER], now=0)
    two, new = tracker.resolve(session_key="s2", messages=[USER], now=0)

    assert new
    assert one.id != two.id


def test_messages_plus_reply_continue_the_trajectory() -> None:
    tracker = TrajectoryTracker(idle_timeout=60)
    first, _ = tracker.resolve(session_key=None, messages=[SYSTEM, USER], now=0)
    tracker.offer_continuation(continuation_hash([SYSTEM, USER], REPLY), first)

    echoed = {**REPLY, "refusal": None}
    state, new = tracker.resolve(session_key=None, messages=[SYSTEM, USER, echoed, NEXT], now=1)

    assert not new
    assert state is first


def test_a_continuation_is_consumed_once() -> None:
    tracker = TrajectoryTracker(idle_timeout=60)
    digest = continuation_hash([USER], REPLY)
    runs = [tracker.resolve(session_key=None, messages=[USER], now=0)[0] for _ in range(2)]
    for state in runs:
        tracker.offer_continuation(digest, state)
    assert runs[0].id != runs[1].id

    continued = [
        tracker.resolve(session_key=None, messages=[USER, REPLY, NEXT], now=1) for _ in range(3)
    ]

    assert [(s.id, new) for s, new in continued[:2]] == [(runs[0].id, False), (runs[1].id, False)]
    third, third_new = continued[2]
    assert third_new
    assert third.id not in {runs[0].id, runs[1].id}


def test_unrelated_messages_start_a_new_trajectory() -> None:
    tracker = TrajectoryTracker(idle_timeout=60)
    first, _ = tracker.resolve(session_key=None, messages=[USER], now=0)
    tracker.offer_continuation(continuation_hash([USER], REPLY), first)

    other, new = tracker.resolve(session_key=None, messages=[NEXT], now=1)
    retry, retry_new = tracker.resolve(session_key=None, messages=[USER], now=1)

    assert new and retry_new
    assert len({first.id, other.id, retry.id}) == 3


def test_session_trajectories_offer_no_continuation() -> None:
    tracker = TrajectoryTracker(idle_timeout=60)
    keyed, _ = tracker.resolve(session_key="s1", messages=[USER], now=0)
    tracker.offer_continuation(continuation_hash([USER], REPLY), keyed)

    state, new = tracker.resolve(session_key=None, messages=[USER, REPLY, NEXT], now=1)

    assert new
    assert state.id != keyed.id


def test_an_idle_session_starts_a_new_trajectory() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    first, _ = tracker.resolve(session_key="s1", messages=[USER], now=0)
    tracker.touch(first, 3, "call-1", [1, 2])

    alive, alive_new = tracker.resolve(session_key="s1", messages=[USER], now=12.9)
    later, later_new = tracker.resolve(session_key="s1", messages=[USER], now=13)

    assert (alive is first, alive_new) == (True, False)
    assert later_new
    assert later.id != first.id
    assert (later.started_at, later.last_call_at) == (13, 13)


def test_an_idle_trajectory_is_not_continued() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    first, _ = tracker.resolve(session_key=None, messages=[USER], now=0)
    tracker.offer_continuation(continuation_hash([USER], REPLY), first)

    state, new = tracker.resolve(session_key=None, messages=[USER, REPLY, NEXT], now=10)

    assert new
    assert state.id != first.id


def test_expire_returns_idle_trajectories_and_forgets_them() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    old, _ = tracker.resolve(session_key=None, messages=[USER], now=0)
    keyed, _ = tracker.resolve(session_key="s1", messages=[USER], now=2)
    recent, _ = tracker.resolve(session_key=None, messages=[USER], now=5)
    digest = continuation_hash([USER], REPLY)
    for state in (old, recent):
        tracker.offer_continuation(digest, state)
    tracker.touch(old, 8, "call-9", [])  # touched last: expires last

    assert tracker.expire(now=14) == [keyed]
    assert tracker.expire(now=17) == [recent]
    assert tracker.get(recent.id) is None
    assert tracker.get(old.id) is old
    # the expired trajectory's continuation is gone; the live one's stays
    follow_up = [USER, REPLY, NEXT]
    assert tracker.resolve(session_key=None, messages=follow_up, now=17) == (old, False)
    assert tracker.resolve(session_key=None, messages=follow_up, now=17)[1]

    again, new = tracker.resolve(session_key="s1", messages=[USER], now=17)
    assert new
    assert again.id != keyed.id


def test_expire_enforces_the_open_cap_oldest_first_without_finishing_them() -> None:
    tracker = TrajectoryTracker(idle_timeout=100, max_open=2)
    states = [tracker.resolve(session_key=None, messages=None, now=t)[0] for t in range(3)]

    # forgotten, but not idle: nothing for the caller to finish (the database does, later)
    assert tracker.expire(now=3) == []
    assert tracker.get(states[0].id) is None and tracker.evicted == 1
    assert [tracker.get(s.id) for s in states[1:]] == states[1:]
    # idle ones past the cap are still returned, to be finished
    assert tracker.expire(now=200) == states[1:]


def test_find_open_revives_an_unknown_session() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    asked: list[str] = []

    def find_open(key: str) -> tuple[str, float, float]:
        asked.append(key)
        return ("traj-from-db", 1.0, 5.0)

    state, new = tracker.resolve(session_key="s1", messages=None, now=6, find_open=find_open)

    assert asked == ["s1"]
    assert not new
    assert (state.id, state.session_key, state.started_at, state.last_call_at) == (
        "traj-from-db",
        "s1",
        1.0,
        5.0,
    )
    assert tracker.get("traj-from-db") is state


def test_find_open_is_not_asked_about_a_known_session() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    first, _ = tracker.resolve(session_key="s1", messages=None, now=0)

    def find_open(key: str) -> None:
        raise AssertionError("asked about a known session")

    state, new = tracker.resolve(session_key="s1", messages=None, now=1, find_open=find_open)

    assert (state, new) == (first, False)


@pytest.mark.parametrize("found", [None, ("stale", 0.0, 1.0)])
def test_find_open_with_nothing_alive_starts_a_new_trajectory(found: Any) -> None:
    tracker = TrajectoryTracker(idle_timeout=10)

    state, new = tracker.resolve(
        session_key="s1", messages=None, now=20, find_open=lambda key: found
    )

    assert new
    assert state.id != "stale"
    assert (state.session_key, state.started_at) == ("s1", 20)


def test_a_revived_session_is_remembered() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    state, _ = tracker.resolve(
        session_key="s1", messages=None, now=6, find_open=lambda key: ("traj-from-db", 1.0, 5.0)
    )
    tracker.touch(state, 6, "call-1", [1, 2, 3])

    def find_open(key: str) -> None:  # e.g. the database is unreachable now
        return None

    again, new = tracker.resolve(session_key="s1", messages=None, now=7, find_open=find_open)

    assert (again.id, new) == ("traj-from-db", False)
    assert (again.last_call_id, list(again.last_sequence)) == ("call-1", [1, 2, 3])


def test_a_revived_session_expires_like_any_other() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    state, _ = tracker.resolve(
        session_key="s1", messages=None, now=6, find_open=lambda key: ("traj-from-db", 1.0, 5.0)
    )

    assert tracker.expire(now=15) == [state]

    again, new = tracker.resolve(session_key="s1", messages=None, now=16, find_open=None)
    assert new
    assert again.id != "traj-from-db"


def test_tool_arguments_compare_as_json_not_text() -> None:
    compact = {"role": "assistant", "tool_calls": [_call("a", arguments='{"x":1,"y":[2]}')]}
    spaced = {"role": "assistant", "tool_calls": [_call("b", arguments='{"y": [2], "x": 1}')]}
    assert normalise_message(compact) == normalise_message(spaced)
    broken = {"role": "assistant", "tool_calls": [_call("c", arguments='{"x": 1')]}
    assert normalise_message(broken)["tool_calls"] == [["add", '{"x": 1']]


def test_arguments_sent_back_in_the_invalid_json_wrapper_are_the_model_s_text() -> None:
    # pydantic-ai sends back arguments that were not a JSON object wrapped, re-serialised
    for raw, wrapped in (
        ('{"x": 1', '{"INVALID_JSON":"{\\"x\\": 1"}'),
        ("[1, 2]", '{"INVALID_JSON":"[1, 2]"}'),
    ):
        sent = {"role": "assistant", "tool_calls": [_call("a", arguments=raw)]}
        back = {"role": "assistant", "tool_calls": [_call("a", arguments=wrapped)]}
        assert normalise_message(back) == normalise_message(sent), raw
    other = {
        "role": "assistant",
        "tool_calls": [_call("a", arguments='{"INVALID_JSON": "x", "y": 1}')],
    }
    assert normalise_message(other)["tool_calls"] == [["add", {"INVALID_JSON": "x", "y": 1}]]


def test_a_failed_call_gives_its_continuation_point_back_for_the_retry() -> None:
    tracker = TrajectoryTracker(idle_timeout=60)
    first = [{"role": "user", "content": "hi"}]
    reply = {"role": "assistant", "content": "hello"}
    state, _ = tracker.resolve(session_key=None, messages=first, now=0.0)
    tracker.offer_continuation(continuation_hash(first, reply), state)
    follow_up = [*first, reply, {"role": "user", "content": "more"}]
    failed, _ = tracker.resolve(session_key=None, messages=follow_up, now=1.0)
    assert failed is state and tracker.taken is not None
    tracker.give_back(tracker.taken, failed)
    retry, new = tracker.resolve(session_key=None, messages=follow_up, now=2.0)
    assert retry is state and not new


def test_idle_time_counts_from_the_end_of_the_last_call() -> None:
    tracker = TrajectoryTracker(idle_timeout=10)
    state, _ = tracker.resolve(session_key="s1", messages=[USER], now=0)
    tracker.touch(state, 30, "call-1", [1])  # a 30 s call

    # 38 s after it started, 8 s after it ended: the same session
    again, new = tracker.resolve(session_key="s1", messages=[USER], now=38)

    assert (again is state, new) == (True, False)
    assert tracker.expire(now=39) == []
    assert tracker.expire(now=40) == [state]


def test_continuation_points_are_bounded() -> None:
    tracker = TrajectoryTracker(idle_timeout=60, max_open=3)
    states = []
    for i in range(5):
        state, _ = tracker.resolve(
            session_key=None, messages=[{"role": "user", "content": i}], now=0
        )
        tracker.offer_continuation(f"digest-{i}", state)
        states.append(state)

    assert list(tracker._continuations) == ["digest-2", "digest-3", "digest-4"]


def test_last_sequences_are_shed_least_recent_first_past_the_token_budget() -> None:
    tracker = TrajectoryTracker(idle_timeout=60, max_tokens=10)
    a, _ = tracker.resolve(session_key="a", messages=None, now=0)
    b, _ = tracker.resolve(session_key="b", messages=None, now=0)
    tracker.touch(a, 1, "a1", [1, 2, 3, 4])
    tracker.touch(b, 2, "b1", [5, 6, 7, 8])
    tracker.touch(a, 3, "a2", [1, 2, 3, 4, 9])

    tracker.touch(b, 4, "b2", [5, 6, 7, 8, 10, 11])  # 11 tokens held: a's go

    assert (list(a.last_sequence), list(b.last_sequence)) == ([], [5, 6, 7, 8, 10, 11])
    assert tracker.tokens == 6
    assert tracker.expire(now=1000) == [a, b]
    assert tracker.tokens == 0


def test_one_conversation_sent_again_and_again_holds_no_more_than_its_open_trajectories() -> None:
    # every call the same prompt and the same reply (a benchmark, a retrying harness): each
    # offers the same digest and none continues; finished ones must not pile up behind it
    tracker = TrajectoryTracker(idle_timeout=60, max_open=100)
    digest = continuation_hash([USER], REPLY)
    for i in range(10_000):
        state, new = tracker.resolve(session_key=None, messages=[USER], now=float(i))
        assert new
        tracker.offer_continuation(digest, state)
        if i % 500 == 0:
            tracker.expire(now=float(i))  # the writer's sweep: the cap finishes the oldest

    assert len(tracker._continuations[digest]) <= 2 * (100 + 500)
    # the open ones are still there to be continued, oldest first
    continued, new = tracker.resolve(session_key=None, messages=[USER, REPLY, NEXT], now=1e4)
    assert not new and tracker.get(continued.id) is continued


def test_an_answered_trajectory_expires_on_its_own_shorter_clock() -> None:
    """After an answer no harness runs a tool: only a person's next message could continue
    it, so it is finished after `answered_timeout`; one waiting on a tool keeps the long
    one, and a later tool call puts an answered one back on it."""
    tracker = TrajectoryTracker(idle_timeout=300, answered_timeout=60)
    tool, _ = tracker.resolve(session_key="tool", messages=[USER], now=0)
    tracker.touch(tool, 1, "call-1", [1], answered=False)  # asked for a tool: least recent
    answer, _ = tracker.resolve(session_key=None, messages=[USER], now=2)
    tracker.touch(answer, 3, "call-2", [1], answered=True)
    again, _ = tracker.resolve(session_key="again", messages=[USER], now=4)
    tracker.touch(again, 5, "call-3", [1], answered=True)
    tracker.touch(again, 6, "call-4", [1, 2], answered=False)  # then a tool call

    assert tracker.expire(now=62.9) == []
    assert tracker.expire(now=63) == [answer]  # behind an older one still open
    alive, new = tracker.resolve(session_key="tool", messages=[USER], now=64)
    assert (alive is tool, new) == (True, False)  # a tool's result, a minute on
    assert tracker.expire(now=300.9) == []
    assert tracker.expire(now=306) == [tool, again]


def test_the_answered_clock_is_never_longer_than_the_idle_timeout() -> None:
    assert TrajectoryTracker(idle_timeout=10, answered_timeout=60).answered_timeout == 10
    assert TrajectoryTracker(idle_timeout=10).answered_timeout == 10
