"""The watch's windows as the store reads them (store/watch_windows.py) turned into what
the detectors take (learner/canary/watch.py), and the alerts on them.

Per trajectory: its reward where graded; complained-or-not where graded and the store keeps
next-turn signals at all (without any, a window says nothing of complaints); its mean reply
length; a refusal where a reply opens by declining; a clarifying question where a reply
asks one instead of working; a broken tool call among the trajectories that made any; the
self-judge's disagreement where it judged beside a ground truth. A list the traffic does not
fill stays short, and its detector silent, below the minimum.
"""

from __future__ import annotations

from collections.abc import Sequence

from learner.canary.watch import (
    Alert,
    Thresholds,
    Window,
    asks_to_clarify,
    dominant_keys,
    is_refusal,
    watch,
)
from store.watch_windows import Served, WatchWindows


def window_of(served: Sequence[Served], *, signals_recorded: bool) -> Window:
    window = Window()
    for one in served:
        if one.reward is not None:
            window.rewards.append(one.reward)
        if one.graded and signals_recorded:
            window.complaints.append(one.complained)
        if one.reply_tokens is not None:
            window.reply_tokens.append(one.reply_tokens)
        if one.replies:
            window.refusals.append(any(is_refusal(r.text) for r in one.replies))
            window.clarifying.append(
                any(asks_to_clarify(r.text, made_tool_calls=r.tool_calls > 0) for r in one.replies)
            )
        if any(r.tool_calls for r in one.replies):
            window.broken_tool_calls.append(any(r.broken_tool_calls for r in one.replies))
        if one.judge_disagrees is not None:
            window.judge_disagrees.append(one.judge_disagrees)
    return window


def alerts_of(windows: WatchWindows, limits: Thresholds | None = None) -> list[Alert]:
    """Every detector's alert on the windows; the flagged keys as one alert, their reasons
    joined (one detector, one alert: the store keeps one per detector)."""
    found = watch(
        window_of(windows.before, signals_recorded=windows.signals_recorded),
        window_of(windows.after, signals_recorded=windows.signals_recorded),
        limits,
    )
    keys = dominant_keys(windows.flagged_keys)
    if keys:
        found.append(Alert(keys[0].detector, "; ".join(alert.reason for alert in keys)))
    return found
