"""Which value a live knob takes: the one set last, by an operator or the command line."""

from __future__ import annotations

import pytest

from learner.control import effective_knobs, own_set_at
from store.control import Control

OWN = {"learning_rate": 1e-5, "batch_trajectories": 16, "max_staleness": 4}


def test_an_operator_value_wins_until_the_command_line_changes() -> None:
    operator = Control(learning_rate=3e-4, set_at={"learning_rate": "2026-01-01T00:00:00+00:00"})
    # first start, or a restart with the same flags: the operator's live change holds
    assert effective_knobs(OWN, own_set_at(OWN, None), operator)["learning_rate"] == 3e-4
    same = {"own": OWN, "own_set_at": {}}
    assert effective_knobs(OWN, own_set_at(OWN, same), operator)["learning_rate"] == 3e-4
    # a restart with a new --learning-rate: set later than the operator's, so it wins
    restarted = {**OWN, "learning_rate": 2e-5}
    stamps = own_set_at(restarted, same)
    assert effective_knobs(restarted, stamps, operator)["learning_rate"] == 2e-5
    # ...and it stays set at that time on the next restart with the same flags
    again = own_set_at(restarted, {"own": restarted, "own_set_at": stamps})
    assert again == stamps
    # until the operator sets it again
    later = operator.changed(learning_rate=5e-4)
    assert effective_knobs(restarted, again, later)["learning_rate"] == 5e-4


def test_clearing_a_knob_returns_it_to_the_learner_own_setting() -> None:
    operator = Control().changed(batch_trajectories=2, max_staleness=1)
    assert effective_knobs(OWN, {}, operator)["batch_trajectories"] == 2
    cleared = operator.changed(batch_trajectories=None)
    assert "batch_trajectories" not in cleared.set_at
    knobs = effective_knobs(OWN, {}, cleared)
    assert knobs["batch_trajectories"] == 16 and knobs["max_staleness"] == 1
    assert Control.from_state(cleared.state()) == cleared


def test_the_fresh_wait_is_a_knob_with_bounds() -> None:
    own = {**OWN, "fresh_wait": 0.0}
    assert effective_knobs(own, {}, Control().changed(fresh_wait=60.0))["fresh_wait"] == 60.0
    for wrong in (-1.0, float("inf"), 1e9):
        with pytest.raises(ValueError, match="fresh_wait"):
            Control(fresh_wait=wrong)
    assert Control.from_state({"fresh_wait": -5}) == Control()


def test_the_batch_bound_is_a_live_knob() -> None:
    own = {**OWN, "max_batch_trajectories": 64}
    operator = Control().changed(max_batch_trajectories=8)
    assert effective_knobs(own, {}, operator)["max_batch_trajectories"] == 8
    cleared = operator.changed(max_batch_trajectories=None)
    assert effective_knobs(own, {}, cleared)["max_batch_trajectories"] == 64
    assert Control(max_batch_trajectories=0).max_batch_trajectories == 0  # no bound
    with pytest.raises(ValueError, match="max_batch_trajectories"):
        Control(max_batch_trajectories=-1)
    # a hand-edited row with a bad value does not stop the learner
    assert Control.from_state({"max_batch_trajectories": -1}) == Control()
