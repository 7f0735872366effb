"""The watch's windows as the store gives them (store/watch_windows.py) turned into the
detectors' inputs (learner/canary/windows.py): what each trajectory counts for, what it does
not (a list the traffic cannot fill stays empty), and the alerts they raise."""

from __future__ import annotations

from learner.canary.watch import Thresholds
from learner.canary.windows import alerts_of, window_of
from store.watch_alerts import DETECTORS
from store.watch_windows import FlaggedKey, Reply, Served, WatchWindows

REFUSE = Reply("I'm sorry, but I can't help with that.")
ASK = Reply("Before I start, could you clarify which file you mean?")
WORK = Reply("Here is the patch.")
TOOL = Reply("", tool_calls=1)
BROKEN = Reply("", tool_calls=2, broken_tool_calls=1)


def served(n: int, **fields: object) -> list[Served]:
    return [Served(trajectory_id=f"t{i}", **fields) for i in range(n)]  # type: ignore[arg-type]


def test_each_trajectory_counts_only_for_what_it_shows() -> None:
    trajectories = [
        Served("graded", reward=1.0, graded=True, complained=True, reply_tokens=12,
               replies=(REFUSE,), judge_disagrees=True),
        Served("asks", replies=(ASK,), reply_tokens=9),
        Served("tools", replies=(TOOL, BROKEN, WORK)),
        Served("failed grade", graded=True),  # graded without a reward
        Served("nothing recorded"),
    ]  # fmt: skip
    window = window_of(trajectories, signals_recorded=True)
    assert window.rewards == [1.0]
    assert window.complaints == [True, False]  # the graded ones
    assert window.reply_tokens == [12, 9]
    assert window.refusals == [True, False, False]  # those with replies
    assert window.clarifying == [False, True, False]
    assert window.broken_tool_calls == [True]  # of those that made tool calls
    assert window.judge_disagrees == [True]
    # no next-turn signal stored anywhere: complaints are not known, not "none"
    assert window_of(trajectories, signals_recorded=False).complaints == []


def test_collapsing_replies_and_growing_refusals_alert_and_keys_join_in() -> None:
    before = served(60, reward=0.2, graded=True, reply_tokens=100, replies=(WORK,))
    after = served(60, reward=0.9, graded=True, reply_tokens=10, replies=(REFUSE,))
    windows = WatchWindows(
        scope="*", version="v2", baseline="v1", before=before, after=after,
        signals_recorded=False,
        flagged_keys=[FlaggedKey("ci-bot", "60 word signals, 95% bad"), FlaggedKey("x", "y")],
    )  # fmt: skip
    alerts = {a.detector: a.reason for a in alerts_of(windows)}
    assert set(alerts) == {"reply length collapsing", "refusals", "one key's feedback dominating"}
    assert "100 -> 10 tokens" in alerts["reply length collapsing"]
    assert alerts["one key's feedback dominating"] == (
        "key ci-bot: 60 word signals, 95% bad; key x: y"
    )
    assert set(alerts) <= set(DETECTORS)
    # the same traffic, below the minimum: the detectors say nothing (the flagged keys are
    # the store's, whatever the windows' size)
    fewer = alerts_of(windows, Thresholds(min_trajectories=61))
    assert [a.detector for a in fewer] == ["one key's feedback dominating"]


def test_alike_windows_raise_nothing() -> None:
    same = served(80, reward=0.5, graded=True, reply_tokens=50, replies=(WORK, TOOL))
    windows = WatchWindows("*", "v2", "v1", same, same, True, [])
    assert alerts_of(windows) == []
