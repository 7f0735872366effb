"""learner.grouping.bound_batch: at most max_batch_trajectories with a signal a step, the
newest whole groups first; what waits is taken later or, once too old, dropped as stale."""

from __future__ import annotations

from learner.grouping import (
    GroupingConfig,
    RunningBaselines,
    Scored,
    bound_batch,
    compute_advantages,
    group_name,
)

NOW = 10
CONFIG = GroupingConfig()  # max_staleness 4
OLDEST = NOW - CONFIG.max_staleness


def _group(name: str, version: int, rewards: list[float]) -> list[Scored]:
    return [
        Scored(f"{name}{i}", f"task-{name}", r, version, group_id=name)
        for i, r in enumerate(rewards)
    ]


def _advantaged(scored: list[Scored], now: int = NOW) -> list:
    kept, _ = compute_advantages(
        scored, current_version_index=now, baselines=RunningBaselines(), config=CONFIG
    )
    return kept


def _ids(rows: list[Scored]) -> list[str]:
    return [s.trajectory_id for s in rows]


def test_under_the_bound_everything_is_one_batch() -> None:
    scored = _group("a", NOW, [1, 0]) + _group("b", NOW, [0, 1])
    batch, waiting = bound_batch(scored, _advantaged(scored), limit=4, oldest=OLDEST)
    assert batch == scored and waiting == []
    # 0: no bound
    batch, waiting = bound_batch(scored, _advantaged(scored), limit=0, oldest=OLDEST)
    assert batch == scored and waiting == []


def test_the_newest_whole_groups_go_first_and_the_rest_waits() -> None:
    scored = (
        _group("old", NOW - 2, [1, 0, 1, 0])
        + _group("flat", NOW - 3, [1, 1])  # no signal: goes with the step, dropped as flat
        + [Scored("stale", "task-stale", 1.0, NOW - 6)]  # too old: goes, dropped as stale
        + _group("new", NOW, [0, 1, 1, 0])
        + _group("mid", NOW - 1, [1, 0, 0, 0])
    )
    batch, waiting = bound_batch(scored, _advantaged(scored), limit=8, oldest=OLDEST)
    assert _ids(waiting) == ["old0", "old1", "old2", "old3"]
    # input order kept (the baselines fold rewards in it); nothing lost, nothing twice
    assert _ids(batch) == [
        *("flat0", "flat1", "stale"),
        *("new0", "new1", "new2", "new3"),
        *("mid0", "mid1", "mid2", "mid3"),
    ]
    kept, metrics = compute_advantages(
        batch, current_version_index=NOW, baselines=RunningBaselines(), config=CONFIG
    )
    assert len(kept) == 8  # at most the bound with a signal
    assert metrics["dropped_flat"] == 2 and metrics["dropped_stale"] == 1


def test_a_group_is_never_split_and_one_larger_than_the_bound_goes_alone() -> None:
    scored = _group("a", NOW - 1, [1, 0, 1]) + _group("b", NOW, [1, 0, 0, 1, 1])
    # 5 with a signal in the newest group, bound 4: it goes whole, alone
    batch, waiting = bound_batch(scored, _advantaged(scored), limit=4, oldest=OLDEST)
    assert _ids(batch) == ["b0", "b1", "b2", "b3", "b4"] and _ids(waiting) == ["a0", "a1", "a2"]
    # room for 2 more after a group of 5: the next (3) does not fit, so it waits whole
    batch, waiting = bound_batch(scored, _advantaged(scored), limit=7, oldest=OLDEST)
    assert len(batch) == 5 and {group_name(s) for s in waiting} == {"group:a"}


def test_organic_singletons_newest_graded_first_within_a_version() -> None:
    # rows come in grading order; single organic trajectories, compared with a baseline
    baselines = RunningBaselines()
    for task in ("t0", "t1", "t2", "t3"):
        baselines.update(task, 0.5)
    scored = [Scored(f"s{i}", f"t{i}", float(i % 2), NOW) for i in range(4)]
    kept, _ = compute_advantages(
        scored, current_version_index=NOW, baselines=baselines, config=CONFIG
    )
    batch, waiting = bound_batch(scored, kept, limit=2, oldest=OLDEST)
    assert _ids(batch) == ["s2", "s3"] and _ids(waiting) == ["s0", "s1"]


def test_live_traffic_repeating_prompts_trains_the_newest_version_s_replies() -> None:
    # Two prompts in rotation, served by three versions since the last step: without a
    # group id a prompt's replies group by version, so a bound of 4 takes the two groups of
    # the current version rather than one prompt's six replies of all three.
    scored = [
        Scored(f"{task}-v{version}-{i}", task, float(i), version)
        for version in (NOW - 2, NOW - 1, NOW)
        for task in ("p", "q")
        for i in range(2)
    ]
    batch, waiting = bound_batch(scored, _advantaged(scored), limit=4, oldest=OLDEST)
    assert {s.version_index for s in batch} == {NOW}
    assert _ids(batch) == ["p-v10-0", "p-v10-1", "q-v10-0", "q-v10-1"]
    assert len(waiting) == 8


def test_what_waits_is_trained_later_or_dropped_as_stale_never_lost() -> None:
    scored = _group("old", NOW - 1, [1, 0]) + _group("new", NOW, [0, 1])
    batch, waiting = bound_batch(scored, _advantaged(scored), limit=2, oldest=OLDEST)
    assert _ids(waiting) == ["old0", "old1"]
    # the next step, one version on, still trains on it
    kept, _ = compute_advantages(
        waiting, current_version_index=NOW + 1, baselines=RunningBaselines(), config=CONFIG
    )
    assert len(kept) == 2
    # a step more than max_staleness versions on drops it as stale: accounted, not lost
    later = NOW + CONFIG.max_staleness
    kept, metrics = compute_advantages(
        waiting, current_version_index=later, baselines=RunningBaselines(), config=CONFIG
    )
    assert kept == [] and metrics["dropped_stale"] == 2
    # and a stale row never waits: it goes with the step that looks at it
    batch, waiting = bound_batch(
        waiting + _group("now", later, [1, 0]),
        _advantaged(waiting + _group("now", later, [1, 0]), now=later),
        limit=1,
        oldest=later - CONFIG.max_staleness,
    )
    assert waiting == [] and _ids(batch) == ["old0", "old1", "now0", "now1"]


def test_shuffled_rewards_are_a_permutation_that_a_second_poll_repeats() -> None:
    from learner.grouping import Scored, shuffle_rewards

    batch = [Scored(f"t{i}", f"task{i % 4}", float(i % 3 == 0), 0) for i in range(24)]
    once, again = shuffle_rewards(batch), shuffle_rewards(list(reversed(batch)))
    assert sorted(s.reward for s in once) == sorted(s.reward for s in batch)
    assert [s.trajectory_id for s in once] == [s.trajectory_id for s in batch]
    assert {s.trajectory_id: s.reward for s in once} == {s.trajectory_id: s.reward for s in again}
    assert [s.reward for s in once] != [s.reward for s in batch]
