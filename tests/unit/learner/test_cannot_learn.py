"""What the learner says where its defaults cannot learn (learner/cannot_learn.py)."""

from __future__ import annotations

from learner.cannot_learn import mostly_truncated, no_signal, slow_to_finish


def test_too_few_graded_trajectories_or_any_signal_say_nothing() -> None:
    assert no_signal([0.0] * 31, with_signal=0, batch=16) is None
    assert no_signal([0.0] * 64, with_signal=1, batch=16) is None


def test_the_cause_and_fix_follow_the_rewards() -> None:
    zero = no_signal([0.0] * 32, with_signal=0, batch=16)
    assert zero is not None and "every one was rewarded 0" in zero and "lenient" in zero
    solved = no_signal([1.0] * 32, with_signal=0, batch=16)
    assert solved is not None and "already solved" in solved
    mixed = no_signal([0.0, 1.0] * 16, with_signal=0, batch=16)
    assert mixed is not None and "alike within every group" in mixed and "--fanout" in mixed


def test_a_step_whose_replies_are_mostly_cut_is_warned_with_the_fix() -> None:
    assert mostly_truncated(8, 10) is None
    warning = mostly_truncated(9, 10)
    assert warning is not None and warning.startswith("9 of 10 replies were cut at max_tokens")
    assert "a larger max_tokens in the harness" in warning
    assert mostly_truncated(0, 0) is None


def test_trajectories_graded_long_after_their_last_call_point_at_the_idle_timeout() -> None:
    assert slow_to_finish(None) is None
    assert slow_to_finish(59.0) is None
    warning = slow_to_finish(301.4)
    assert warning is not None and warning.startswith("trajectories reached the grader 301s")
    assert "--idle-timeout" in warning
