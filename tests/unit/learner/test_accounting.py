"""learner.accounting: what a step trained on and dropped, by reason, in the unit it happened
in, with the setting that changes each reason."""

from __future__ import annotations

from learner.accounting import CONSTRAINT_SETTING, REASONS, StepAccount
from learner.grouping import GroupingConfig, RunningBaselines, Scored, compute_advantages

NOW = 10


def _grouped() -> tuple[StepAccount, int]:
    """A batch of 9 trajectories through the real grouping: 1 stale, a flat group of 2, a
    singleton without a baseline, a group of 3 with a signal; plus 1 served by no verified
    version and 1 too stale to grade, as the learner adds them."""
    scored = [
        Scored("old", "t-old", 1.0, NOW - 5),  # more than max_staleness (4) versions old
        Scored("f1", "flat", 1.0, NOW),
        Scored("f2", "flat", 1.0, NOW),
        Scored("single", "seen-once", 0.5, NOW),
        Scored("g1", "g", 1.0, NOW, group_id="fanout:1"),
        Scored("g2", "g", 0.0, NOW, group_id="fanout:1"),
        Scored("g3", "g", 0.0, NOW, group_id="fanout:1"),
    ]
    kept, metrics = compute_advantages(
        scored, current_version_index=NOW, baselines=RunningBaselines(), config=GroupingConfig()
    )
    assert len(kept) == 3
    metrics = {**metrics, "stale_not_graded": 1.0, "dropped_unknown_version": 1.0}
    considered = len(scored) + 2
    return StepAccount.of_grouping(metrics, considered=considered, waiting=5), considered


def test_every_trajectory_considered_is_trained_on_or_dropped_for_one_reason() -> None:
    account, considered = _grouped()
    assert account.considered == considered == 9
    assert account.with_signal == 3 and account.waiting == 5
    assert dict(account.trajectories) == {
        "stale": 2,  # graded but too old, and too stale to grade: one reason
        "flat_group": 2,
        "no_baseline": 1,
        "unknown_version": 1,
    }
    assert account.considered == account.with_signal + sum(account.trajectories.values())


def test_samples_and_calls_are_counted_in_their_own_units_with_their_settings() -> None:
    account, _ = _grouped()
    account.built(
        calls_skipped={"sampling unknown": 2, "logit_bias": 1, "failed": 0},
        samples=10,
        dropped={"truncated": 6, "no_tokens": 1},
        trajectories=2,
    )
    assert account.trained_samples == 3
    account.trained({"samples": 3, "trained_tokens": 40, "dropped_mismatch": 1})
    assert account.trained_samples == 2 and account.trained_trajectories == 2
    assert account.samples_built == account.trained_samples + sum(account.samples.values())

    dropped = account.dropped()
    counts = [d["count"] for d in dropped]
    assert counts == sorted(counts, reverse=True)  # biggest first
    by_reason = {(d["reason"], d["unit"]): d for d in dropped}
    assert "failed" not in {d["reason"] for d in dropped}  # zero counts are left out
    assert by_reason["truncated", "samples"]["count"] == 6
    assert "--truncated train" in by_reason["truncated", "samples"]["setting"]
    assert by_reason["stale", "trajectories"]["setting"] == "--max-staleness"
    assert "--type-baseline" in by_reason["no_baseline", "trajectories"]["setting"]
    assert by_reason["mismatch", "samples"]["setting"] == "max_sequence_mismatch"
    assert by_reason["sampling unknown", "calls"]["count"] == 2
    assert by_reason["logit_bias", "calls"]["setting"] == CONSTRAINT_SETTING
    # every reason the learner can meet names what changes it
    assert all(r.setting for r in REASONS.values())

    metrics = account.metrics()
    assert metrics["considered_trajectories"] == 9
    assert metrics["signal_trajectories"] == 3 and metrics["waiting_trajectories"] == 5
    assert metrics["trained_trajectories"] == 2 and metrics["trained_samples"] == 2
    assert metrics["samples_built"] == 10
    assert metrics["trained_share"] == 2 / 9
    assert metrics["dropped"] == dropped


def test_the_step_line_says_what_was_trained_and_dropped_and_why() -> None:
    # issue 23: almost every reply cut at max_tokens, while the line said "kept 256"
    account = StepAccount.of_grouping(
        {"kept": 256, "dropped_flat": 9, "dropped_stale": 2, "stale_not_graded": 1},
        considered=268,
        waiting=40,
    )
    account.built(
        calls_skipped={"sampling unknown": 5},
        samples=247,
        dropped={"truncated": 241},
        trajectories=4,
    )
    account.trained({"samples": 6, "dropped_mismatch": 0})
    assert account.summary() == (
        "6 samples trained, from 4 of 268 trajectories considered; dropped: "
        "truncated 241 samples (--truncated train, or a larger max_tokens in the harness), "
        "flat group 9 trajectories (group size: --fanout, --group-size; or task difficulty), "
        "sampling unknown 5 calls (vLLM --enable-scale-out), "
        "stale 3 trajectories (--max-staleness); "
        "40 trajectories with a signal wait for a later step (--max-batch-trajectories)"
    )
    assert account.low
    assert account.warning() == (
        "trained on 4 of the 268 trajectories it considered (1%), mostly dropped as "
        "truncated 241 samples (--truncated train, or a larger max_tokens in the harness), "
        "flat group 9 trajectories (group size: --fanout, --group-size; or task difficulty)"
    )


def test_a_step_that_trains_on_most_of_its_batch_is_not_low() -> None:
    account = StepAccount.of_grouping({"kept": 16, "dropped_flat": 4}, considered=20)
    account.built(calls_skipped={}, samples=16, dropped={}, trajectories=16)
    account.trained({"samples": 16, "dropped_mismatch": 0})
    assert not account.low and account.share == 0.8
    assert account.summary() == (
        "16 samples trained, from 16 of 20 trajectories considered; dropped: flat group 4 "
        "trajectories (group size: --fanout, --group-size; or task difficulty)"
    )
    nothing = StepAccount.of_grouping({"kept": 1}, considered=1)
    nothing.built(calls_skipped={}, samples=1, dropped={}, trajectories=1)
    nothing.trained({"samples": 1, "dropped_mismatch": 0})
    assert (
        nothing.summary() == "1 sample trained, from 1 of 1 trajectory considered; dropped: nothing"
    )


def test_a_batch_with_nothing_to_train_on_says_why() -> None:
    # every sample truncated: the trainer is given nothing
    truncated = StepAccount.of_grouping({"kept": 3}, considered=3)
    truncated.built(calls_skipped={}, samples=3, dropped={"truncated": 3}, trajectories=0)
    truncated.trained({"tokens": 0, "skipped": "no trainable tokens"})
    assert truncated.trained_samples == 0 and truncated.low
    assert dict(truncated.samples) == {"truncated": 3}
    assert "truncated 3 samples (--truncated train" in truncated.summary()

    # every sequence the trainer got disagreed with what vLLM recorded
    mismatched = StepAccount.of_grouping({"kept": 2}, considered=2)
    mismatched.built(calls_skipped={}, samples=2, dropped={}, trajectories=2)
    mismatched.trained({"tokens": 0, "dropped_mismatch": 2, "skipped": "all sequences dropped"})
    assert mismatched.trained_samples == 0 and mismatched.trained_trajectories == 0
    assert mismatched.summary() == (
        "0 samples trained, from 0 of 2 trajectories considered; dropped: "
        "sequence mismatch 2 samples (max_sequence_mismatch)"
    )

    # samples with no token after the first position: the trainer finds nothing to train
    untrained = StepAccount.of_grouping({"kept": 1}, considered=1)
    untrained.built(calls_skipped={}, samples=1, dropped={}, trajectories=1)
    untrained.trained({"tokens": 0, "skipped": "no trainable tokens"})
    assert dict(untrained.samples) == {"no_tokens": 1} and untrained.trained_samples == 0
