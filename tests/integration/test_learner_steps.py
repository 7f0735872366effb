"""The learner's step on a real database, with a stand-in trainer and publisher (no model
needed): the batch bound (max_batch_trajectories), the wait for the serving version's own
samples (fresh_wait), the step's accounting of what it dropped, by reason, in its log
line, its metrics and the heartbeat, and the step reported to real TensorBoard event files,
a W&B offline run and an MLflow store in a local file (--report-to)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine, select

from learner.config import LearnerConfig
from learner.control import heartbeat
from learner.loop import Learner
from learner.loop import step as loop_step
from learner.trackers import Reporter
from learner.trainer import Trainer, TrainerConfig
from store import grade_queue, policy_versions, recording
from store.models import Grade
from store.samples import Sample
from store.trajectory_record import Trajectory, TrajectoryCall
from tests.support.records import served_calls
from tests.support.wandb_runs import offline_run

# trajectory -> (group, policy version of its calls, reward)
Batch = dict[str, tuple[str | None, str, float]]


def _versions(engine: Engine, n: int, start: int = 0) -> None:
    with engine.begin() as conn:
        for ordinal in range(start, start + n):
            policy_versions.add_version(
                conn, version=f"v{ordinal}", ordinal=ordinal,
                parent=f"v{ordinal - 1}" if ordinal else None,
                checkpoint_path=None, status="serving",
            )  # fmt: skip


def _graded(engine: Engine, batch: Batch) -> None:
    """Finished trajectories, one call each by their version, graded in this order."""
    now = time.time()
    with engine.begin() as conn:
        trajectories, calls = [], []
        for i, (tid, (group, version, _)) in enumerate(batch.items()):
            trajectories.append(
                {
                    "id": tid,
                    "session_key": f"s-{tid}",
                    "task_key": f"task-{group or tid}",
                    "group_key": group,
                    "status": "finished",
                    "started_at": now + i,
                    "last_call_at": now + i,
                }
            )
            calls += served_calls(tid, [version], now + i)
        recording.write_batch(conn, trajectories=trajectories, calls=calls)
    for tid, (_, _, reward) in batch.items():
        with engine.begin() as conn:
            grade_queue.save_grade(conn, trajectory_id=tid, reward=reward, detail={}, error=None)


def _learner(db_url: str, tmp_path: Path, **extra: Any) -> Learner:
    config = LearnerConfig(
        database_url=db_url,
        model=str(tmp_path),
        graders=["feedback"],
        checkpoints=str(tmp_path / "ckpt"),
        **extra,
    )
    learner = Learner(config)
    _serve_newest(learner)
    return learner


def _serve_newest(learner: Learner) -> None:
    with learner.state.engine.connect() as conn:
        learner.state.shared.serving = policy_versions.serving_version(conn)


def _trained_in(engine: Engine) -> dict[str, int | None]:
    with engine.connect() as conn:
        return dict(conn.execute(select(Grade.trajectory_id, Grade.trained_in_step)).all())


def test_a_step_takes_the_newest_groups_and_what_waits_grows_stale_not_lost(
    db_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _versions(engine, 3)  # v0, v1, v2 (serving)
    _graded(
        engine,
        {
            "old0": ("old", "v1", 1.0),
            "old1": ("old", "v1", 0.0),
            "new0": ("new", "v2", 0.0),
            "new1": ("new", "v2", 1.0),
            "flat0": ("flat", "v2", 1.0),  # no signal: goes with the step, as flat
            "flat1": ("flat", "v2", 1.0),
            "u": (None, "not-verified", 1.0),  # goes with the step, as an unknown version
        },
    )
    learner = _learner(
        db_url, tmp_path, batch_trajectories=2, max_batch_trajectories=2, max_staleness=2
    )
    steps: list[dict[str, Any]] = []

    def recorded(advantaged, considered, group_metrics, baselines, *, waiting=0) -> None:
        step = len(steps) + 1
        steps.append(
            {
                "trained": sorted(a.trajectory_id for a in advantaged),
                "considered": sorted(considered),
                "metrics": group_metrics,
                "waiting": waiting,
            }
        )
        with engine.begin() as conn:  # as a recorded step does
            grade_queue.mark_trained(conn, trajectory_ids=considered, step=step)
        learner.state.shared.baselines = baselines

    monkeypatch.setattr(learner.stepping, "_train", recorded)
    try:
        assert learner.maybe_train()
        first = steps[0]
        assert first["trained"] == ["new0", "new1"] and first["waiting"] == 2
        assert first["considered"] == ["flat0", "flat1", "new0", "new1", "u"]
        assert first["metrics"]["dropped_flat"] == 2.0
        assert first["metrics"]["dropped_unknown_version"] == 1.0
        # what waits is neither marked nor lost: graded, untrained, still trainable
        assert _trained_in(engine)["old0"] is None and _trained_in(engine)["old1"] is None
        with engine.connect() as conn:
            waiting = {r["trajectory_id"] for r in grade_queue.trainable_grades(conn)}
        assert waiting == {"old0", "old1"}

        # three versions later it is too stale: the next step drops it as stale
        _versions(engine, 3, start=3)  # v5 serves; v1 is 4 versions older
        _serve_newest(learner)
        assert not learner.maybe_train()  # nothing with a signal: no step yet
        _graded(engine, {"next0": ("next", "v5", 1.0), "next1": ("next", "v5", 0.0)})
        assert learner.maybe_train()
        second = steps[1]
        assert second["trained"] == ["next0", "next1"] and second["waiting"] == 0
        assert second["considered"] == ["next0", "next1", "old0", "old1"]
        assert second["metrics"]["dropped_stale"] == 2.0
        assert set(_trained_in(engine).values()) == {1, 2}  # every one accounted for
    finally:
        learner.state.engine.dispose()


def test_with_fresh_wait_a_ready_step_waits_for_the_serving_version_s_samples(
    db_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _versions(engine, 2)  # v0, v1 (serving)
    _graded(engine, {"old0": ("old", "v0", 1.0), "old1": ("old", "v0", 0.0)})
    learner = _learner(
        db_url, tmp_path, batch_trajectories=2, max_batch_trajectories=2, fresh_wait=60.0
    )
    steps: list[dict[str, Any]] = []

    def recorded(advantaged, considered, group_metrics, baselines, *, waiting=0) -> None:
        steps.append({"trained": sorted(a.trajectory_id for a in advantaged), **group_metrics})
        with engine.begin() as conn:
            grade_queue.mark_trained(conn, trajectory_ids=considered, step=len(steps))

    monkeypatch.setattr(learner.stepping, "_train", recorded)
    try:
        # a batch with a signal is there, but v0's: the step waits for v1's own samples
        assert not learner.maybe_train() and not steps
        assert "waiting for the serving version's samples (0 of 2" in learner.state.activity
        _graded(engine, {"new0": ("new", "v1", 0.0), "new1": ("new", "v1", 1.0)})
        assert learner.maybe_train()
        assert steps[0]["trained"] == ["new0", "new1"]  # on-policy; v0's wait for later
        assert steps[0]["staleness_mean"] == steps[0]["staleness_max"] == 0.0
        assert 0.0 <= steps[0]["fresh_wait_seconds"] < 60.0
        assert _trained_in(engine)["old0"] is None

        # v2 serves and answers nothing: after the wait the step trains on what it has
        _versions(engine, 1, start=2)
        _serve_newest(learner)
        assert not learner.maybe_train() and len(steps) == 1
        assert learner.state.shared.fresh.ready_since is not None
        learner.state.shared.fresh.ready_since -= (
            60.0  # the limit has passed (no sleeping in tests)
        )
        assert learner.maybe_train()
        assert steps[1]["trained"] == ["old0", "old1"]
        assert steps[1]["staleness_mean"] == steps[1]["staleness_max"] == 2.0  # v0 under v2
        assert steps[1]["fresh_wait_seconds"] >= 60.0
        assert learner.state.shared.fresh.ready_since is None  # the next step waits anew
    finally:
        learner.state.engine.dispose()


class _Trainer:
    """The trainer's choices of what to train (`untrainable`) with a stand-in step."""

    untrainable = Trainer.untrainable

    def __init__(self, truncated: str) -> None:
        self.config = TrainerConfig(truncated=truncated)
        self.given: list[Sample] = []

    def set_learning_rate(self, value: float) -> None:
        pass

    def step(self, samples: list[Sample], advantages: list[float], **_: Any) -> dict[str, Any]:
        self.given = samples
        if not samples:
            return {"tokens": 0, "skipped": "no trainable tokens"}
        return {"samples": len(samples), "trained_tokens": 3, "dropped_mismatch": 0, "loss": 0.5}


def _call(prompt: list[int], completion: list[int], **extra: Any) -> TrajectoryCall:
    recorded: dict[str, Any] = {
        "capture_complete": True,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": [-0.5] * len(completion),
        "finish_reason": "stop",
        "policy_version": "v1",
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
    }
    return TrajectoryCall("", "completions", **(recorded | extra))


def _stepping(
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    finish: str,
    truncated: str = "mask",
    **extra: Any,
) -> tuple[Learner, _Trainer, list[dict[str, Any]]]:
    """A learner about to step on a group of 4 with a signal (g3 has two samples; g2's
    call has no recorded sampling), a flat group of 2 and one unknown version; the group's
    replies finish with `finish`, but g0's, which stops, unless all are cut."""
    _versions(engine, 2)
    _graded(
        engine,
        {
            **{f"g{i}": ("g", "v1", float(i % 2)) for i in range(4)},
            "flat0": ("flat", "v1", 0.0),
            "flat1": ("flat", "v1", 0.0),
            "u": (None, "not-verified", 1.0),
        },
    )
    calls = {
        "g0": [_call([1, 2], [3], finish_reason="stop" if finish == "stop" else finish)],
        "g1": [_call([1, 2], [3], finish_reason="length")],
        "g2": [_call([1, 2], [3], sampling=None)],
        "g3": [
            _call([1, 2], [3], finish_reason=finish),
            _call([7, 8], [9], finish_reason="length"),
        ],
    }
    monkeypatch.setattr(
        loop_step,
        "load_trajectories",
        lambda engine, ids: [Trajectory(tid, tuple(calls[tid])) for tid in ids],
    )
    learner = _learner(db_url, tmp_path, batch_trajectories=4, **extra)
    trainer = _Trainer(truncated)  # overlong filtering unless told: every cut reply out
    learner.state.shared.trainer = trainer  # type: ignore[assignment]
    learner.state.shared.publisher = object()  # type: ignore[assignment]
    published: list[dict[str, Any]] = []

    def publish(step: int, metrics: dict[str, Any], considered: list[str], baselines: Any):
        published.append(metrics)
        return SimpleNamespace(
            ok=True, version="step-1-abc", swap_seconds=0.5, weight_sums_compared=2,
            max_logprob_diff=0.001, error=None,
        )  # fmt: skip

    monkeypatch.setattr(learner.publishing, "publish_step", publish)
    return learner, trainer, published


def test_the_step_line_and_metrics_say_what_was_dropped_and_why(
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    learner, trainer, published = _stepping(db_url, engine, tmp_path, monkeypatch, "stop")
    caplog.set_level(logging.INFO, logger="onthejob.learner")
    try:
        assert learner.maybe_train()
    finally:
        learner.state.engine.dispose()
    assert sorted(s.trajectory_id for s in trainer.given) == ["g0", "g3"]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1:")]
    assert line.startswith(
        "step 1: 2 samples trained, from 2 of 7 trajectories considered; dropped: "
        "flat group 2 trajectories (group size: --fanout, --group-size; or task difficulty), "
        "truncated 2 samples (--truncated train, or a larger max_tokens in the harness), "
        "unknown version 1 trajectory (no setting: no verified version), "
        "sampling unknown 1 call (vLLM --enable-scale-out); 3 tokens, reward "
    )
    assert line.endswith("-> step-1-abc")
    # 2 of 7 is more than a quarter: no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (metrics,) = published
    assert metrics["considered_trajectories"] == 7 and metrics["signal_trajectories"] == 4
    assert metrics["trained_trajectories"] == 2 and metrics["trained_samples"] == 2
    assert metrics["samples_built"] == 4 and metrics["waiting_trajectories"] == 0
    assert [(d["reason"], d["unit"], d["count"]) for d in metrics["dropped"]] == [
        ("flat_group", "trajectories", 2),
        ("truncated", "samples", 2),
        ("unknown_version", "trajectories", 1),
        ("sampling unknown", "calls", 1),
    ]
    assert metrics["skipped_calls"] == {"sampling unknown": 1} and metrics["kept"] == 4.0
    assert learner.state.last_batch is not None and learner.state.last_batch["trained"] is True


def test_a_batch_with_nothing_to_train_on_says_why_by_reason(
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    learner, trainer, published = _stepping(db_url, engine, tmp_path, monkeypatch, "length")
    caplog.set_level(logging.INFO, logger="onthejob.learner")
    try:
        assert learner.maybe_train()
        beat = heartbeat(learner.state)
    finally:
        learner.state.engine.dispose()
    assert trainer.given == [] and published == []  # no version
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "batch of 7 trajectories had nothing to train on: 0 samples trained, from 0 of 7 "
        "trajectories considered; dropped: truncated 4 samples (--truncated train, or a "
        "larger max_tokens in the harness), flat group 2 trajectories (group size: --fanout, "
        "--group-size; or task difficulty), unknown version 1 trajectory (no setting: no "
        "verified version), sampling unknown 1 call (vLLM --enable-scale-out); 4 of 4 "
        "replies were cut at max_tokens: the grader scored replies the client never got "
        "whole, and the model learns little but to say less; fix: a larger max_tokens in the "
        "harness, so that replies can end"
    ]
    assert set(_trained_in(engine).values()) == {-1}  # consumed, in no step
    last = beat["last_batch"]
    assert last["trained"] is False and last["trained_samples"] == 0
    assert last["dropped"][0]["reason"] == "truncated" and last["dropped"][0]["count"] == 4


def test_on_defaults_a_step_whose_every_reply_was_cut_says_so_with_the_fix(
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--truncated last (the default) trains the cut replies that were their trajectory's
    last (g0, g1, and g3's second) and leaves out g3's first, cut before the reply its grade
    was given on; the first step's line says that every reply was cut, and what fixes it."""
    learner, trainer, published = _stepping(
        db_url, engine, tmp_path, monkeypatch, "length", truncated="last"
    )
    caplog.set_level(logging.INFO, logger="onthejob.learner")
    try:
        assert learner.maybe_train()
    finally:
        learner.state.engine.dispose()
    assert sorted(s.trajectory_id for s in trainer.given) == ["g0", "g1", "g3"]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1:")]
    assert "4 of 4 replies were cut at max_tokens" in line
    assert "fix: a larger max_tokens in the harness" in line
    assert line.endswith("-> step-1-abc")
    # the line says where the step's time went
    assert "since the last step: " in line and "gathering the batch" in line
    assert "s training, " in line and "s saving, 0.50s swap" in line
    (metrics,) = published
    assert metrics["trained_samples"] == 3
    truncated = [d for d in metrics["dropped"] if d["reason"] == "truncated"]
    assert [d["count"] for d in truncated] == [1]


def test_graded_traffic_without_any_signal_is_said_once_with_the_fix(
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No step is ever ready when every group's rewards are alike: the learner says so
    (no step line would), once."""
    _versions(engine, 2)
    _graded(engine, {f"t{i}": (f"task{i % 4}", "v1", 0.0) for i in range(8)})
    learner = _learner(db_url, tmp_path, batch_trajectories=4)
    caplog.set_level(logging.INFO, logger="onthejob.learner")
    try:
        assert not learner.maybe_train()
        assert not learner.maybe_train()
    finally:
        learner.state.engine.dispose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "no step yet: 8 graded trajectories, none with a signal (every one was rewarded 0); "
        "fix: the task is beyond the model as it answers now, or the grader never passes a "
        "reply: read a few graded replies (onthejob export) and try a lenient or "
        "partial-credit grader, or easier tasks first"
    ]
    assert learner.state.activity.startswith("no step yet")


TRACKED = {"report_to": ["tensorboard", "wandb", "mlflow"], "run_name": "run-1"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the trackers' import-time ones
def test_a_step_reaches_tensorboard_wandb_and_mlflow(
    db_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    learner, _, _ = _stepping(
        db_url, engine, tmp_path, monkeypatch, "stop", report_dir=runs, **TRACKED
    )
    try:
        assert [t.name for t in learner.state.reporter.trackers] == [
            "tensorboard",
            "wandb",
            "mlflow",
        ]
        assert learner.maybe_train()
        verdict = {"type": "qa", "before": {"value": 0.5}, "after": {"value": 0.75}}
        learner.state.reporter.guard(1, {"outcome": "kept", "types": [verdict]})
    finally:
        learner.state.reporter.close()
        learner.state.engine.dispose()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(runs / "tensorboard" / "run-1"))
    events.Reload()
    scalars = {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
    assert scalars["trained_samples"] == [(1, 2.0)] and scalars["loss"] == [(1, 0.5)]
    assert scalars["dropped/flat_group"] == [(1, 2.0)]
    assert scalars["published"] == [(1, 1.0)]
    assert scalars["guard/qa/after"] == [(1, 0.75)] and scalars["guard/kept"] == [(1, 1.0)]

    config, history = offline_run(runs / "wandb")
    assert history[1]["trained_samples"] == 2 and history[1]["guard/qa/before"] == 0.5
    assert config["batch_trajectories"] == 4

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("onthejob").experiment_id])
    assert run.info.run_name == "run-1" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "trained_samples")
    assert [(m.step, m.value) for m in history] == [(1, 2.0)]
    assert run.data.params["batch_trajectories"] == "4"
    assert run.data.params["report_to"] == "tensorboard,wandb,mlflow"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_failing_tracker_is_switched_off_once_and_the_learner_goes_on(
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="onthejob.learner")
    learner, _, published = _stepping(
        db_url, engine, tmp_path, monkeypatch, "stop", report_dir=tmp_path / "runs", **TRACKED
    )
    try:
        wandb = next(t for t in learner.state.reporter.trackers if t.name == "wandb")
        wandb.run.finish()  # W&B refuses to log to a finished run: a real failure
        assert learner.maybe_train() and len(published) == 1  # the step is done all the same
        learner.state.reporter.step(2, {"mean_reward": 1.0})
    finally:
        learner.state.reporter.close()
        learner.state.engine.dispose()
    said = [r.getMessage() for r in caplog.records if "--report-to wandb" in r.getMessage()]
    assert len(said) == 1 and "is off for this run" in said[0], said
    # trackers that cannot start say why, and nothing else happens
    (tmp_path / "blocked").write_text("a file where the directory should be")
    other = Reporter(["mlflow", "tensorboard"], tmp_path / "blocked", "run-2", {})
    assert other.trackers == []
    assert len([r for r in caplog.records if "could not start" in r.getMessage()]) == 2
    other.close()


def test_the_steps_are_measured_on_the_samples_of_every_version_a_grpo_step_led_from(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    """v5 serves; v2..v5 were published by GRPO steps (each recorded its scale, the same
    one), v1 by something else (a rollback): the samples of v4, v3, v2 and v1 measure the
    last step, each with its share (1/n, n steps back), up to --max-staleness back; v0's
    are not."""
    learner = _learner(db_url, tmp_path, max_staleness=4)
    with engine.begin() as conn:
        for ordinal in range(6):
            policy_versions.add_version(
                conn, version=f"v{ordinal}", ordinal=ordinal,
                parent=f"v{ordinal - 1}" if ordinal else None,
                checkpoint_path=None, status="serving",
                metrics={"step_scale": 0.5} if ordinal >= 2 else {},
            )  # fmt: skip
        serving = policy_versions.version(conn, version="v5")
    assert serving is not None
    measured = learner.stepping._measured_from(serving)
    assert measured == pytest.approx({"v4": 1, "v3": 1 / 2, "v2": 1 / 3, "v1": 1 / 4})
    learner.state.grouping = dataclasses.replace(learner.state.grouping, max_staleness=2)
    assert learner.stepping._measured_from(serving) == pytest.approx({"v4": 1, "v3": 1 / 2})
