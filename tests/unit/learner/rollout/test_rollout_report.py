"""Eval numbers: pass@k, per-task summaries, the version x task set table."""

from __future__ import annotations

import itertools
from math import isclose

import pytest

from learner.rollout.report import by_version_and_set, format_table, pass_at_k, summarise


def brute_force_pass_at_k(outcomes: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_pass_at_k_is_the_chance_that_k_of_the_runs_hold_a_success(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert isclose(pass_at_k(n, c, k), brute_force_pass_at_k(outcomes, k))
    assert pass_at_k(2, 1, 5) == 1.0  # k above n: all runs
    assert pass_at_k(0, 0, 1) == 0.0


def run(task: str, reward: float | None, version: str = "v0") -> dict:
    return {
        "rollout_id": "r",
        "task_set": "set",
        "task_key": task,
        "policy_version": version,
        "reward": reward,
    }


def test_summaries_per_task_and_version() -> None:
    runs = [run("a", 1.0), run("a", 0.0), run("a", 0.5), run("a", None), run("b", 0.0)]
    runs.append(run("b", 1.0, version="v1"))
    rows = {(r["task_key"], r["policy_version"]): r for r in summarise(runs, k=3, threshold=0.5)}
    a = rows[("a", "v0")]
    assert (a["runs"], a["successes"], a["k"]) == (3, 2, 3)  # the ungraded run is not counted
    assert isclose(a["mean_reward"], 0.5) and isclose(a["pass_at_1"], 2 / 3)
    assert a["pass_at_k"] == 1.0
    assert (rows[("b", "v0")]["pass_at_k"], rows[("b", "v0")]["k"]) == (0.0, 1)
    assert rows[("b", "v1")]["pass_at_1"] == 1.0


def test_report_orders_versions_and_weights_by_runs() -> None:
    rows = summarise(
        [run("a", 1.0, "new"), run("a", 1.0, "new"), run("b", 0.0, "new"), run("a", 0.0, "old")],
        k=2,
        threshold=1.0,
    )
    table = by_version_and_set(rows, order={"old": 0, "new": 1})
    assert [r["policy_version"] for r in table] == ["old", "new"]
    new = table[1]
    assert (new["tasks"], new["runs"]) == (2, 3)
    assert isclose(new["mean_reward"], 2 / 3) and isclose(new["pass_at_1"], 2 / 3)
    assert isclose(new["pass_at_k"], 0.5)  # mean over tasks: a 1.0, b 0.0
    text = format_table(table).splitlines()
    assert text[0].split()[:3] == ["policy", "version", "task"]
    assert text[2].split() == ["new", "set", "2", "3", "0.667", "0.667", "0.500", "(k=2)"]
