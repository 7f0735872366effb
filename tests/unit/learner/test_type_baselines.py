"""Singletons against their interaction type's baseline (learner/type_baselines.py) through
learner.grouping's rules: used only when the task has none, per policy version, persisted."""

from __future__ import annotations

import json

import pytest

from learner.grouping import (
    Baselines,
    GroupingConfig,
    RunningBaselines,
    Scored,
    compute_advantages,
)
from learner.type_baselines import UNTYPED, Reward, TypeBaselines

NOW = 10
CONFIG = GroupingConfig()  # max_staleness 4


def _s(
    trajectory_id: str,
    reward: float,
    kind: str | None = "chat",
    version: int = NOW,
    task: str | None = None,
    group: str | None = None,
) -> Scored:
    # a unique task per sample unless told: organic traffic
    return Scored(trajectory_id, task or f"task-{trajectory_id}", reward, version, group, kind)


def _run(
    scored: list[Scored],
    types: TypeBaselines,
    tasks: RunningBaselines | None = None,
    config: GroupingConfig = CONFIG,
) -> tuple[dict[str, float], dict[str, float]]:
    kept, metrics = compute_advantages(
        scored,
        current_version_index=NOW,
        baselines=tasks if tasks is not None else RunningBaselines(),
        type_baselines=types,
        config=config,
    )
    return {a.trajectory_id: a.advantage for a in kept}, metrics


def _dropped(metrics: dict[str, float]) -> float:
    return metrics["dropped_stale"] + metrics["dropped_flat"] + metrics["dropped_no_baseline"]


def test_singletons_of_one_type_and_version_are_compared_with_each_other() -> None:
    # rewards 1, 0, 0.5 of one type, all unique tasks: leave-one-out means 0.25, 0.75, 0.5
    advantages, metrics = _run([_s("a", 1.0), _s("b", 0.0), _s("c", 0.5)], TypeBaselines())

    assert advantages == pytest.approx({"a": 0.75, "b": -0.75})  # c: 0.5 - 0.5 = 0, flat
    assert metrics["baseline_from_type"] == 2.0
    assert metrics["dropped_flat"] == 1.0 and metrics["dropped_no_baseline"] == 0.0


def test_without_type_baselines_singletons_are_dropped_as_before() -> None:
    for types in (None, TypeBaselines("off")):
        kept, metrics = compute_advantages(
            [_s("a", 1.0), _s("b", 0.0)],
            current_version_index=NOW,
            baselines=RunningBaselines(),
            type_baselines=types,
            config=CONFIG,
        )
        assert kept == []
        assert metrics["dropped_no_baseline"] == 2.0 and metrics["baseline_from_type"] == 0.0


def test_a_task_with_its_own_baseline_does_not_use_the_type() -> None:
    # task "known" has baseline 0.9; the type's leave-one-out mean for it would be 0.0
    tasks = RunningBaselines.from_state({"known": 0.9})
    scored = [_s("a", 1.0, task="known"), _s("b", 0.0)]
    advantages, metrics = _run(scored, TypeBaselines(), tasks)

    assert advantages == pytest.approx({"a": 0.1, "b": -1.0})  # b: 0 - (a's 1.0)
    assert metrics["baseline_from_type"] == 1.0


def test_full_groups_keep_their_group_mean() -> None:
    scored = [_s("a", 1.0, task="t"), _s("b", 0.0, task="t"), _s("c", 0.2)]
    advantages, metrics = _run(scored, TypeBaselines())

    # the group {a, b} against its mean 0.5; c against the others of its type: (1 + 0) / 2
    assert advantages == pytest.approx({"a": 0.5, "b": -0.5, "c": -0.3})
    assert metrics["baseline_from_type"] == 1.0


def test_types_and_versions_do_not_mix() -> None:
    # "x" at version 10: 1.0, 0.0; "y" at 10: 0.4 (alone); "x" at version 9: 0.6 (alone)
    scored = [_s("a", 1.0, "x"), _s("b", 0.0, "x"), _s("c", 0.4, "y"), _s("d", 0.6, "x", 9)]
    advantages, metrics = _run(scored, TypeBaselines("batch"))

    assert advantages == pytest.approx({"a": 1.0, "b": -1.0})
    assert metrics["dropped_no_baseline"] == 2.0  # c, d: nothing else of their type and version


def test_version_mode_uses_earlier_batches_of_the_same_version() -> None:
    types = TypeBaselines("version")
    _run([_s("a", 1.0), _s("b", 0.6)], types)  # version 10 of "chat": 2 rewards, sum 1.6
    advantages, _ = _run([_s("c", 0.0)], types)

    assert advantages == pytest.approx({"c": -0.8})  # 0 - 1.6 / 2
    assert types.version_mean("chat", NOW) == pytest.approx(1.6 / 3)


def test_version_mode_falls_back_to_the_types_moving_average_on_a_new_version() -> None:
    types = TypeBaselines("version", decay=0.5)
    _run([_s("a", 1.0, version=9), _s("b", 0.0, version=9)], types)  # ema: 1.0 -> 0.5
    advantages, metrics = _run([_s("c", 1.0)], types)  # version 10: nothing else yet

    assert advantages == pytest.approx({"c": 0.5})
    assert metrics["baseline_from_type"] == 1.0


def test_batch_mode_ignores_earlier_batches() -> None:
    types = TypeBaselines("batch")
    _run([_s("a", 1.0), _s("b", 0.6)], types)
    advantages, metrics = _run([_s("c", 0.0)], types)

    assert advantages == {} and metrics["dropped_no_baseline"] == 1.0


def test_ema_mode_uses_the_moving_average_from_before_the_batch() -> None:
    types = TypeBaselines("ema", decay=0.5)
    advantages, _ = _run([_s("a", 1.0), _s("b", 0.0)], types)  # unseen type: seeded in batch
    assert advantages == pytest.approx({"a": 1.0, "b": -1.0})
    assert types.ema("chat") == pytest.approx(0.5)  # 1.0, then 0.5 * 1 + 0.5 * 0

    advantages, _ = _run([_s("c", 1.0), _s("d", 0.25, version=8)], types)
    assert advantages == pytest.approx({"c": 0.5, "d": -0.25})  # versions alike: 0.5


def test_trajectories_without_a_type_share_the_untyped_baseline() -> None:
    types = TypeBaselines()
    advantages, _ = _run([_s("a", 1.0, None), _s("b", 0.0, None), _s("c", 0.7, UNTYPED)], types)

    assert advantages == pytest.approx({"a": 0.65, "b": -0.85, "c": 0.2})
    assert types.version_mean(None, NOW) == pytest.approx(1.7 / 3)


def test_a_stale_sample_neither_gets_nor_gives_a_type_baseline() -> None:
    types = TypeBaselines()
    advantages, metrics = _run([_s("old", 9.0, version=5), _s("a", 1.0, version=5 + 1)], types)

    assert advantages == {}  # a is alone in version 6; old (5) is stale
    assert metrics["dropped_stale"] == 1.0 and metrics["dropped_no_baseline"] == 1.0
    assert types.version_mean("chat", 5) is None


def test_versions_gone_stale_are_forgotten() -> None:
    types = TypeBaselines()
    types.update([Reward("chat", 3, 1.0), Reward("chat", 7, 0.5)], oldest_version=6)

    assert types.version_mean("chat", 3) is None
    assert types.version_mean("chat", 7) == pytest.approx(0.5)


def test_every_sample_is_kept_or_counted_as_dropped_once() -> None:
    tasks = RunningBaselines.from_state({"known": 0.0})
    scored = [
        _s("stale", 1.0, version=1),
        _s("flat1", 0.5, task="f"),
        _s("flat2", 0.5, task="f"),
        _s("alone", 1.0, "rare"),  # only one of its type: no baseline
        _s("single", 1.0, task="known"),
        _s("typed1", 1.0),
        _s("typed2", 0.0),
        _s("g1", 1.0, group="g"),
        _s("g2", 0.0, group="g"),
    ]
    advantages, metrics = _run(scored, TypeBaselines(), tasks)

    assert set(advantages) == {"single", "typed1", "typed2", "g1", "g2"}
    assert metrics["dropped_stale"] == 1.0
    assert metrics["dropped_flat"] == 2.0
    assert metrics["dropped_no_baseline"] == 1.0
    assert metrics["baseline_from_type"] == 2.0
    assert metrics["kept"] + _dropped(metrics) == len(scored)


def test_state_round_trips_through_json() -> None:
    baselines = Baselines.fresh("version")
    compute_advantages(
        [_s("a", 1.0), _s("b", 0.5, "other", version=9), _s("c", 0.0, None)],
        current_version_index=NOW,
        baselines=baselines.tasks,
        type_baselines=baselines.types,
        config=CONFIG,
    )
    stored = json.loads(json.dumps(baselines.states()))  # as learner_state keeps it
    restored = Baselines.from_states(stored, "version")

    assert restored.states() == baselines.states()
    assert restored.types.version_mean("other", 9) == pytest.approx(0.5)
    assert restored.types.ema(None) == pytest.approx(0.0)
    assert restored.tasks.get("task-a") == pytest.approx(1.0)
    copy = restored.copy()
    copy.types.update([Reward("chat", NOW, 0.0)], oldest_version=0)
    assert restored.types.version_mean("chat", NOW) == pytest.approx(1.0)  # a copy, not a view


def test_nothing_stored_gives_empty_baselines() -> None:
    baselines = Baselines.from_states({"baselines": None, "type_baselines": None}, "ema")

    assert baselines.types.mode == "ema" and baselines.types.state() == {"ema": {}, "versions": {}}


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="mode"):
        TypeBaselines("median")
