"""Where the learner's defaults cannot learn from the traffic, what it says, and the fix.

Two cases no setting of the learner's own can mend, so they are said plainly rather than
left to an operator to find in the counts:
- the graded trajectories carry no signal: every group's rewards are alike, so no step is
  ever ready and no step line is ever printed (`no_signal`);
- (nearly) every reply is cut at max_tokens: the harness's limit, not the model, decides
  what the grader sees (`mostly_truncated`);
- trajectories reach the grader long after their last call (`slow_to_finish`): the proxy
  finishes one only after its --idle-timeout (300 s by default) passes without a call, so
  single-call traffic trains on answers minutes old; and grading waits while a step trains
  or the self-judge's shadow judgements run on a busy vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

# graded trajectories without a signal before the learner says so: a few batches' worth
NO_SIGNAL_AFTER_BATCHES = 2
# the share of a step's replies cut at max_tokens from which the step line warns
TRUNCATED_SHARE = 0.9
# median seconds from a trained trajectory's last call to its grade from which the step
# line warns: far longer than grading itself takes
SLOW_GRADING_SECONDS = 60.0


def no_signal(rewards: Sequence[float], *, with_signal: int, batch: int) -> str | None:
    """Why the learner has not stepped, when `rewards` (every graded trajectory waiting for a
    step) hold at least NO_SIGNAL_AFTER_BATCHES x `batch` and none carries a signal."""
    if with_signal > 0 or len(rewards) < NO_SIGNAL_AFTER_BATCHES * batch:
        return None
    low, high = min(rewards), max(rewards)
    if low == high:
        what = f"every one was rewarded {low:g}"
        if low <= 0:
            fix = (
                "the task is beyond the model as it answers now, or the grader never passes "
                "a reply: read a few graded replies (onthejob export) and try a lenient or "
                "partial-credit grader, or easier tasks first"
            )
        else:
            fix = "the task is already solved: nothing is left to learn from it"
    else:
        what = f"rewards range {low:g}-{high:g}, but alike within every group"
        fix = (
            "each task is answered once or its runs agree: more runs per task (--fanout in "
            "the proxy, or the harness run several times per task), or --type-baseline"
        )
    return (
        f"no step yet: {len(rewards)} graded trajectories, none with a signal ({what}); fix: {fix}"
    )


def mostly_truncated(cut: int, built: int) -> str | None:
    """A warning when at least TRUNCATED_SHARE of a step's `built` samples hold a reply cut
    at max_tokens (`cut`)."""
    if built == 0 or cut < TRUNCATED_SHARE * built:
        return None
    return (
        f"{cut} of {built} replies were cut at max_tokens: the grader scored replies the "
        "client never got whole, and the model learns little but to say less; fix: a larger "
        "max_tokens in the harness, so that replies can end"
    )


def slow_to_finish(grading_lag: float | None) -> str | None:
    """A warning when the trained trajectories were graded, at the median, more than
    SLOW_GRADING_SECONDS after their last call."""
    if grading_lag is None or grading_lag < SLOW_GRADING_SECONDS:
        return None
    return (
        f"trajectories reached the grader {grading_lag:.0f}s after their last call: the "
        "proxy finishes one once its --idle-timeout (300 s by default) passes without a "
        "call, and grading waits while a step trains or the self-judge judges; fix: for "
        "single-call traffic, a shorter `onthejob serve --idle-timeout`, or a session key "
        "per run (/s/<key>/v1) with its outcome posted; --self-judge-shadow 0 where vLLM is "
        "busy"
    )
