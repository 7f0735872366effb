"""learner.grouping: GRPO groups, advantages and the per-task running baselines."""

from __future__ import annotations

import math

import pytest

from learner.grouping import (
    Advantaged,
    GroupingConfig,
    RunningBaselines,
    Scored,
    compute_advantages,
)

NOW = 10  # current policy version index in every test
CONFIG = GroupingConfig()  # max_staleness 4, no std division, min group size 2


def _s(
    trajectory_id: str, task: str, reward: float, version: int = NOW, group: str | None = None
) -> Scored:
    return Scored(trajectory_id, task, reward, version, group)


def _run(
    scored: list[Scored],
    baselines: RunningBaselines | None = None,
    config: GroupingConfig = CONFIG,
) -> tuple[dict[str, float], dict[str, float]]:
    """Advantages by trajectory id, and the metrics."""
    kept, metrics = compute_advantages(
        scored,
        current_version_index=NOW,
        baselines=baselines if baselines is not None else RunningBaselines(),
        config=config,
    )
    return {a.trajectory_id: a.advantage for a in kept}, metrics


def _dropped(metrics: dict[str, float]) -> float:
    return metrics["dropped_stale"] + metrics["dropped_flat"] + metrics["dropped_no_baseline"]


# -- groups ----------------------------------------------------------------------------------


def test_advantage_is_reward_minus_group_mean() -> None:
    # task t: rewards 1, 0, 0.5 -> mean 0.5 -> advantages +0.5, -0.5, 0 (kept: the group has
    # signal; only whole flat groups go).
    advantages, metrics = _run([_s("a", "t", 1.0), _s("b", "t", 0.0), _s("c", "t", 0.5)])

    assert advantages == pytest.approx({"a": 0.5, "b": -0.5, "c": 0.0})
    assert metrics["groups"] == 1.0 and metrics["kept"] == 3.0
    assert metrics["mean_reward"] == pytest.approx(0.5)
    assert metrics["mean_abs_advantage"] == pytest.approx(1 / 3)  # (0.5 + 0.5 + 0) / 3


def test_explicit_group_id_wins_over_task_key() -> None:
    # Same task key, three groups: g1 {1, 0} mean 0.5; g2 {0.2, 0.6} mean 0.4;
    # no group id {0.9, 0.1} -> grouped by task key, mean 0.5.
    scored = [
        _s("a", "t", 1.0, group="g1"),
        _s("b", "t", 0.0, group="g1"),
        _s("c", "t", 0.2, group="g2"),
        _s("d", "t", 0.6, group="g2"),
        _s("e", "t", 0.9),
        _s("f", "t", 0.1),
    ]
    kept, metrics = compute_advantages(
        scored, current_version_index=NOW, baselines=RunningBaselines(), config=CONFIG
    )

    assert [a.advantage for a in kept] == pytest.approx([0.5, -0.5, -0.2, 0.2, 0.4, -0.4])
    assert [a.group for a in kept] == ["group:g1"] * 2 + ["group:g2"] * 2 + ["task:t@v10"] * 2
    assert metrics["groups"] == 3.0


def test_group_id_and_task_key_namespaces_do_not_collide() -> None:
    # group id "x" and task key "x" are different groups: {1, 0} and {0.4, 0.2}.
    scored = [
        _s("a", "other", 1.0, group="x"),
        _s("b", "other", 0.0, group="x"),
        _s("c", "x", 0.4),
        _s("d", "x", 0.2),
    ]
    advantages, metrics = _run(scored)

    assert advantages == pytest.approx({"a": 0.5, "b": -0.5, "c": 0.1, "d": -0.1})
    assert metrics["groups"] == 2.0


def test_output_keeps_input_order_across_interleaved_groups() -> None:
    scored = [_s("a", "t", 1.0), _s("b", "u", 2.0), _s("c", "t", 0.0), _s("d", "u", 0.0)]
    kept, _ = compute_advantages(
        scored, current_version_index=NOW, baselines=RunningBaselines(), config=CONFIG
    )

    assert kept == [
        Advantaged("a", 0.5, "task:t@v10"),
        Advantaged("b", 1.0, "task:u@v10"),
        Advantaged("c", -0.5, "task:t@v10"),
        Advantaged("d", -1.0, "task:u@v10"),
    ]


def test_a_task_s_replies_group_by_the_version_that_produced_them() -> None:
    # Version 9 scored 0 and 1, version 10 scored 2 and 4: each is compared with its own
    # version's mean, not with 1.75 over all four (which would credit version 10 for having
    # improved). An explicit group id spans versions: it is one fan-out.
    scored = [
        _s("a", "t", 0.0, version=9),
        _s("b", "t", 2.0),
        _s("c", "t", 1.0, version=9),
        _s("d", "t", 4.0),
        _s("e", "t", 0.0, version=9, group="g"),
        _s("f", "t", 1.0, group="g"),
    ]
    kept, _ = compute_advantages(
        scored, current_version_index=NOW, baselines=RunningBaselines(), config=CONFIG
    )

    assert [(a.trajectory_id, a.group) for a in kept] == [
        ("a", "task:t@v9"),
        ("b", "task:t@v10"),
        ("c", "task:t@v9"),
        ("d", "task:t@v10"),
        ("e", "group:g"),
        ("f", "group:g"),
    ]
    assert [a.advantage for a in kept] == pytest.approx([-0.5, -1.0, 0.5, 1.0, -0.5, 0.5])


# -- staleness -------------------------------------------------------------------------------


def test_samples_older_than_max_staleness_are_dropped() -> None:
    # NOW = 10, max_staleness 4: version 6 (4 behind) stays, version 5 (5 behind) goes.
    # Left: a (1.0), b (0.0) of version 6 -> mean 0.5.
    scored = [_s("a", "t", 1.0, version=6), _s("b", "t", 0.0, version=6), _s("c", "t", 9.0, 5)]
    baselines = RunningBaselines()
    advantages, metrics = _run(scored, baselines)

    assert advantages == pytest.approx({"a": 0.5, "b": -0.5})
    assert metrics["dropped_stale"] == 1.0
    assert metrics["mean_reward"] == pytest.approx(0.5)  # the stale 9.0 is not counted
    # nor does it reach the baseline: seeded 1.0, then 0.9 * 1.0 + 0.1 * 0.0 = 0.9
    assert baselines.get("t") == pytest.approx(0.9)


def test_stale_members_leave_a_singleton_behind() -> None:
    # The fan-out group lost one member to staleness; the survivor uses the baseline 0.25.
    baselines = RunningBaselines.from_state({"t": 0.25})
    scored = [_s("a", "t", 1.0, version=2, group="g"), _s("b", "t", 1.0, group="g")]
    advantages, metrics = _run(scored, baselines)

    assert advantages == pytest.approx({"b": 0.75})
    assert metrics["dropped_stale"] == 1.0 and metrics["kept"] == 1.0


# -- flat groups -----------------------------------------------------------------------------


def test_flat_groups_are_dropped_but_seed_the_baseline() -> None:
    # {1, 1, 1} has no signal; {0, 1} does (mean 0.5).
    scored = [_s("a", "t", 1.0), _s("b", "t", 1.0), _s("c", "t", 1.0)]
    scored += [_s("d", "u", 0.0), _s("e", "u", 1.0)]
    baselines = RunningBaselines()
    advantages, metrics = _run(scored, baselines)

    assert advantages == pytest.approx({"d": -0.5, "e": 0.5})
    assert metrics["dropped_flat"] == 3.0 and metrics["groups"] == 1.0
    assert metrics["mean_reward"] == pytest.approx(4 / 5)  # all fresh rewards: (3 + 0 + 1) / 5
    assert baselines.get("t") == pytest.approx(1.0)


def test_rewards_equal_up_to_rounding_are_flat() -> None:
    advantages, metrics = _run([_s("a", "t", 0.3), _s("b", "t", 0.1 + 0.2)])

    assert advantages == {}
    assert metrics["dropped_flat"] == 2.0


# -- singletons ------------------------------------------------------------------------------


def test_singleton_without_baseline_only_seeds_it() -> None:
    baselines = RunningBaselines()
    advantages, metrics = _run([_s("a", "t", 0.2)], baselines)

    assert advantages == {}
    assert metrics["dropped_no_baseline"] == 1.0
    assert baselines.get("t") == pytest.approx(0.2)


def test_singleton_uses_the_baseline_from_before_its_own_reward() -> None:
    # baseline 0.2: advantage 1.0 - 0.2 = 0.8; then baseline 0.9 * 0.2 + 0.1 * 1.0 = 0.28.
    baselines = RunningBaselines.from_state({"t": 0.2})
    advantages, metrics = _run([_s("a", "t", 1.0)], baselines)

    assert advantages == pytest.approx({"a": 0.8})
    assert metrics["groups"] == 1.0
    assert baselines.get("t") == pytest.approx(0.28)


def test_singletons_of_one_task_in_one_batch_share_the_old_baseline() -> None:
    # Two fan-out survivors of task t in separate groups: both against 0.5, not against a
    # baseline moved by the first one.
    baselines = RunningBaselines.from_state({"t": 0.5})
    scored = [_s("a", "t", 1.0, group="g1"), _s("b", "t", 0.0, group="g2")]
    advantages, _ = _run(scored, baselines)

    assert advantages == pytest.approx({"a": 0.5, "b": -0.5})
    # 0.5 -> 0.9 * 0.5 + 0.1 * 1.0 = 0.55 -> 0.9 * 0.55 + 0.1 * 0.0 = 0.495
    assert baselines.get("t") == pytest.approx(0.495)


def test_singleton_equal_to_its_baseline_is_flat() -> None:
    baselines = RunningBaselines.from_state({"t": 0.5})
    advantages, metrics = _run([_s("a", "t", 0.5)], baselines)

    assert advantages == {}
    assert metrics["dropped_flat"] == 1.0


def test_groups_below_min_group_size_use_the_baseline() -> None:
    # min size 3: {1.0, 0.0} is too small for a mean; against baseline 0.4: +0.6, -0.4.
    baselines = RunningBaselines.from_state({"t": 0.4})
    config = GroupingConfig(min_group_size=3)
    advantages, _ = _run([_s("a", "t", 1.0), _s("b", "t", 0.0)], baselines, config)

    assert advantages == pytest.approx({"a": 0.6, "b": -0.4})


# -- std normalisation -----------------------------------------------------------------------


def test_std_normalise_divides_by_the_batch_std() -> None:
    # Raw advantages: {1, 0} -> +0.5, -0.5; {0, 0.2} -> -0.1, +0.1.
    # Population std = sqrt((0.25 + 0.25 + 0.01 + 0.01) / 4) = sqrt(0.13).
    scored = [_s("a", "t", 1.0), _s("b", "t", 0.0), _s("c", "u", 0.0), _s("d", "u", 0.2)]
    advantages, _ = _run(scored, config=GroupingConfig(std_normalise=True))

    raw = {"a": 0.5, "b": -0.5, "c": -0.1, "d": 0.1}
    assert advantages == pytest.approx({key: a / math.sqrt(0.13) for key, a in raw.items()})


def test_std_normalise_leaves_a_lone_advantage_unchanged() -> None:
    baselines = RunningBaselines.from_state({"t": 0.25})
    advantages, _ = _run([_s("a", "t", 1.0)], baselines, GroupingConfig(std_normalise=True))

    assert advantages == pytest.approx({"a": 0.75})


def test_std_normalise_is_off_by_default() -> None:
    advantages, _ = _run([_s("a", "t", 4.0), _s("b", "t", 0.0)])

    assert advantages == pytest.approx({"a": 2.0, "b": -2.0})


# -- accounting ------------------------------------------------------------------------------


def test_every_sample_is_kept_or_counted_as_dropped_once() -> None:
    baselines = RunningBaselines.from_state({"known": 0.0})
    scored = [
        _s("stale", "t", 1.0, version=1),
        _s("flat1", "f", 0.5),
        _s("flat2", "f", 0.5),
        _s("new", "unseen", 1.0),
        _s("single", "known", 1.0),
        _s("g1", "t", 1.0),
        _s("g2", "t", 0.0),
    ]
    advantages, metrics = _run(scored, baselines)

    assert set(advantages) == {"single", "g1", "g2"}
    assert metrics["dropped_stale"] == 1.0
    assert metrics["dropped_flat"] == 2.0
    assert metrics["dropped_no_baseline"] == 1.0
    assert metrics["kept"] + _dropped(metrics) == len(scored)
    assert all(type(value) is float for value in metrics.values())


def test_empty_input_gives_zero_metrics() -> None:
    advantages, metrics = _run([])

    assert advantages == {}
    assert metrics["kept"] == 0.0 and metrics["mean_reward"] == 0.0


def test_non_finite_rewards_are_rejected() -> None:
    with pytest.raises(ValueError, match="not finite"):
        _run([_s("a", "t", math.nan), _s("b", "t", 1.0)])


def test_config_rejects_groups_of_one() -> None:
    with pytest.raises(ValueError, match="min_group_size"):
        GroupingConfig(min_group_size=1)


# -- RunningBaselines ------------------------------------------------------------------------


def test_running_baseline_is_an_exponential_moving_average() -> None:
    baselines = RunningBaselines(decay=0.5)
    assert baselines.get("t") is None

    baselines.update("t", 1.0)  # seed: 1.0
    baselines.update("t", 0.0)  # 0.5 * 1.0 + 0.5 * 0.0 = 0.5
    baselines.update("t", 1.0)  # 0.5 * 0.5 + 0.5 * 1.0 = 0.75

    assert baselines.get("t") == pytest.approx(0.75)
    assert baselines.get("u") is None


def test_running_baseline_state_round_trips() -> None:
    baselines = RunningBaselines(decay=0.8)
    baselines.update("t", 2.0)
    baselines.update("u", -1.0)

    restored = RunningBaselines.from_state(baselines.state(), decay=0.8)
    restored.update("t", 0.0)  # 0.8 * 2.0 + 0.2 * 0.0 = 1.6

    assert restored.get("t") == pytest.approx(1.6)
    assert restored.get("u") == pytest.approx(-1.0)
    assert baselines.get("t") == pytest.approx(2.0)  # state() is a copy, not a view


def test_running_baseline_rejects_a_decay_outside_zero_one() -> None:
    with pytest.raises(ValueError, match="decay"):
        RunningBaselines(decay=1.0)
