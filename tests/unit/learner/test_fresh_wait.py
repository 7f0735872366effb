"""FreshWait: how long a ready step waits for the serving version's own samples."""

from __future__ import annotations

from learner.fresh_wait import FreshWait


def test_a_ready_step_waits_for_fresh_samples_up_to_the_limit() -> None:
    wait = FreshWait(limit_seconds=30.0)
    assert wait.should_wait(False, now=100.0)
    assert wait.should_wait(False, now=129.0)
    assert not wait.should_wait(False, now=130.0)  # the limit: trains on what it has
    assert wait.took(now=130.0) == 30.0
    # the next ready step waits anew
    assert wait.should_wait(False, now=200.0) and wait.waited(now=205.0) == 5.0


def test_enough_fresh_samples_or_no_limit_means_no_wait() -> None:
    wait = FreshWait(limit_seconds=30.0)
    assert wait.should_wait(False, now=0.0)
    assert not wait.should_wait(True, now=1.0)  # they came: the step trains now
    assert wait.took(now=1.0) == 1.0 and wait.waited() == 0.0
    off = FreshWait(limit_seconds=0.0)
    assert not off.should_wait(False, now=0.0) and off.took(now=5.0) == 0.0


def test_reset_forgets_a_wait_that_ended_without_a_step() -> None:
    wait = FreshWait(limit_seconds=30.0)
    assert wait.should_wait(False, now=0.0)
    wait.reset()  # e.g. the batch went below --batch-trajectories (an operator's knob)
    assert wait.should_wait(False, now=100.0) and wait.waited(now=110.0) == 10.0
