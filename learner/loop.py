"""`onthejob learn`: grade finished trajectories, run GRPO on their exact tokens, publish.

One iteration: grade what finished -> if enough trajectories carry a signal, one optimizer
step -> checkpoint -> hot-swap into every vLLM replica -> verify -> record. A failed swap is
rolled back (the previous version keeps serving, the trainer returns to its weights).
Everything the learner needs to resume lives in the database and the checkpoints.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import Engine
from tqdm import tqdm

from learner import control, queries
from learner.checkpoint import load_model, save_checkpoint
from learner.config import LearnerConfig
from learner.graders.combine import build_graders
from learner.graders.tasks import TaskTable
from learner.grouping import GroupingConfig, RunningBaselines, Scored, compute_advantages
from learner.lora import (
    LoraSettings,
    adapter_base,
    is_adapter,
    load_trainable,
    merge,
    save_adapter,
    wrap,
)
from learner.lora_publisher import LoraPublisher
from learner.loss import LossConfig
from learner.publisher import FullReloadPublisher, Probe, current_version, served_adapters
from learner.samples import Sample, build_samples, sampling_defaults
from learner.trainer import Trainer, TrainerConfig
from proxy.export import iter_trajectories
from proxy.store import db

log = logging.getLogger("onthejob.learner")

GRADE_BATCH = 256
PENDING_RECHECK = 30.0  # seconds before trajectories waiting for feedback are graded again
PROBE_TEXT = "The quick brown fox jumps over the lazy dog."


class DatabaseFeedback:
    """Feedback posted through the proxy's feedback endpoint, read from the store."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def reward_for(
        self, trajectory_id: str, session: str | None
    ) -> tuple[float, str | None] | None:
        with self.engine.connect() as conn:
            return queries.latest_feedback(conn, trajectory_id=trajectory_id, session_key=session)


class Learner:
    def __init__(self, config: LearnerConfig) -> None:
        self.config = config
        db.upgrade(config.database_url)
        self.engine = db.make_engine(config.database_url)
        self.model_dir = Path(config.model)
        self.checkpoints = Path(config.checkpoints)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.defaults = sampling_defaults(self.model_dir)
        self.grader = build_graders(
            config.graders,
            judge_base_url=config.judge_base_url or config.upstreams[0] + "/v1",
            judge_model=config.judge_model,
            feedback_source=DatabaseFeedback(self.engine),
            feedback_wait_seconds=config.feedback_wait,
            command_timeout=config.command_timeout,
        )
        self.grouping = GroupingConfig(
            max_staleness=config.max_staleness, std_normalise=config.std_normalise
        )
        self.lora_settings = LoraSettings(
            rank=config.lora_rank, alpha=config.lora_alpha, targets=tuple(config.lora_targets)
        )
        self.trainer_config = TrainerConfig(
            learning_rate=config.learning_rate,
            max_grad_norm=config.max_grad_norm,
            micro_batch_tokens=config.micro_batch_tokens,
            mask_truncated=config.mask_truncated,
            max_sequence_mismatch=config.max_sequence_mismatch,
            loss=LossConfig(
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                max_importance_weight=config.max_importance_weight,
                kl_coef=config.kl_coef,
            ),
        )
        self.tasks = TaskTable()
        self.trainer: Trainer | None = None
        self.publisher: FullReloadPublisher | None = None
        self.serving: dict[str, Any] | None = None
        self.baselines = RunningBaselines()
        self.step = 0
        self._grading: tqdm | None = None
        self._pending: set[str] = set()
        self._pending_since = time.monotonic()

    # -- start-up ---------------------------------------------------------------------
    def start(self) -> None:
        if self.config.tasks:
            self._load_tasks(Path(self.config.tasks))
        with self.engine.begin() as conn:
            self.serving = queries.serving_version(conn)
            self.step = queries.last_step(conn)
            state = queries.get_state(conn, "baselines")
            if state:
                self.baselines = RunningBaselines.from_state(state)
            first_start = self.serving is None
            if first_start:
                # the weights vLLM serves now become version 0; its checkpoint is written
                # by us so it always holds lm_head.weight (a rollback to it must be exact)
                version = current_version(self.config.upstreams[0])
                if version in served_adapters(self.config.upstreams[0]):
                    # an adapter from some other run answers now: version 0 is the base,
                    # under a name of its own, swapped in below like after a crash
                    version = f"base-{os.urandom(3).hex()}"
                    first_start = False
                base = self.checkpoints / "base"
                if not base.exists():
                    save_checkpoint(load_model(self.model_dir), base, source_dir=self.model_dir)
                queries.add_version(
                    conn,
                    version=version,
                    ordinal=queries.next_ordinal(conn),
                    parent=None,
                    checkpoint_path=str(base),
                    status="serving",
                )
                self.serving = queries.serving_version(conn)
        assert self.serving is not None
        source = Path(self.serving["checkpoint_path"])
        self.trainer = self._trainer(source)
        self._load_optimizer(source)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        probe = Probe(prompt_token_ids=list(tokenizer(PROBE_TEXT)["input_ids"]))
        self.publisher = self._publisher(probe, source)
        if not first_start:
            self._resync(source)
        log.info(
            "learner ready: serving %s (step %d), graders %s",
            self.serving["version"],
            self.step,
            ", ".join(self.config.graders),
        )

    def _resync(self, source: Path) -> None:
        """After a crash, make every replica serve what the database says is serving."""
        assert self.serving is not None and self.publisher is not None
        assert self.trainer is not None
        version = self.serving["version"]
        # always swap in what the database says serves, verified: a learner that died in
        # the middle of a swap may have left a replica paused or holding unpublished weights
        result = self.publisher.rollback(source, version, expected=self.trainer.logprobs_of)
        if not result.ok:
            raise RuntimeError(f"could not restore {version}: {result.error}")

    def _load_tasks(self, path: Path) -> None:
        table = TaskTable.from_jsonl(path)
        rows = [
            {
                "key": t.key,
                "prompt": t.prompt,
                "answer": t.answer,
                "match": t.match,
                "tolerance": t.tolerance,
                "metadata": t.metadata,
            }
            for t in table.values()
        ]
        with self.engine.begin() as conn:
            queries.upsert_tasks(conn, rows)
        self.tasks = table
        log.info("loaded %d tasks from %s", len(rows), path)

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        self.start()
        while self.config.max_steps is None or self.step < self.config.max_steps:
            if control.follow(self):  # operator pause and live knobs (admin API)
                continue
            graded = self.grade_finished()
            trained = self.maybe_train()
            if not graded and not trained:
                time.sleep(self.config.poll_interval)

    def grade_finished(self) -> int:
        with self.engine.connect() as conn:
            if time.monotonic() - self._pending_since > PENDING_RECHECK:
                # feedback may have arrived for what was waiting: look at it again
                self._pending, self._pending_since = set(), time.monotonic()
            ids = queries.ungraded_finished(conn, limit=GRADE_BATCH, skip=sorted(self._pending))
            backlog = queries.count_ungraded_finished(conn) if len(ids) == GRADE_BATCH else 0
        if backlog > GRADE_BATCH and self._grading is None:
            # a long phase (e.g. a learner started on a full database): show progress
            self._grading = tqdm(total=backlog, desc="grading", unit="trajectory")
        if not ids:
            return 0
        trajectories = list(iter_trajectories(self.engine, ids=ids))
        grades = self.grader.grade(trajectories, tasks=self.tasks)
        saved = 0
        with self.engine.begin() as conn:
            for trajectory, grade in zip(trajectories, grades, strict=True):
                if grade.pending:
                    self._pending.add(trajectory["id"])  # not before the next recheck
                    continue
                queries.save_grade(
                    conn,
                    trajectory_id=trajectory["id"],
                    reward=grade.reward,
                    detail=grade.detail,
                    error=grade.error,
                )
                saved += 1
                if grade.error:
                    log.warning("trajectory %s not graded: %s", trajectory["id"], grade.error)
        if self._grading is not None:
            self._grading.update(len(trajectories))
            if len(ids) < GRADE_BATCH:
                self._grading.close()
                self._grading = None
        return saved

    def _follow_operator(self) -> None:
        """`onthejob rollback` may have changed what serves: train on from there."""
        assert self.serving is not None
        with self.engine.connect() as conn:
            serving = queries.serving_version(conn)
        if serving is not None and serving["version"] != self.serving["version"]:
            log.info(
                "now serving %s (changed by an operator); training from it", serving["version"]
            )
            self.serving = serving
            source = Path(serving["checkpoint_path"])
            self.trainer = self._trainer(source)
            self._load_optimizer(source)

    def maybe_train(self) -> bool:
        self._follow_operator()
        with self.engine.connect() as conn:
            waiting = queries.incomplete_groups(conn)
            rows = [r for r in queries.trainable_grades(conn) if r["group_key"] not in waiting]
            ordinals = queries.version_ordinals(conn)
        if not rows:
            return False
        assert self.serving is not None
        current = int(self.serving["ordinal"])
        scored = [
            Scored(
                trajectory_id=r["trajectory_id"],
                task_key=r["task_key"] or r["trajectory_id"],
                reward=float(r["reward"]),
                version_index=ordinals.get(r["policy_version"], 0),
                group_id=r["group_key"],
            )
            for r in rows
        ]
        # on a copy: the same rows come back at every poll until a step consumes them
        baselines = RunningBaselines.from_state(self.baselines.state())
        advantaged, group_metrics = compute_advantages(
            scored, current_version_index=current, baselines=baselines, config=self.grouping
        )
        if len(advantaged) < self.config.batch_trajectories:
            return False
        self.baselines = baselines
        self._train(advantaged, [s.trajectory_id for s in scored], group_metrics)
        return True

    def _train(
        self, advantaged: list[Any], considered: list[str], group_metrics: dict[str, float]
    ) -> None:
        assert self.trainer is not None and self.publisher is not None and self.serving
        advantage_of = {a.trajectory_id: a.advantage for a in advantaged}
        trajectories = list(iter_trajectories(self.engine, ids=list(advantage_of)))
        samples: list[Sample] = []
        advantages: list[float] = []
        for trajectory in trajectories:
            for sample in build_samples(trajectory, defaults=self.defaults):
                samples.append(sample)
                advantages.append(advantage_of[trajectory["id"]])
        keep = set(map(id, self.trainer.trainable(samples)))
        pairs = [(s, a) for s, a in zip(samples, advantages, strict=True) if id(s) in keep]
        step = self.step + 1
        metrics = self.trainer.step([s for s, _ in pairs], [a for _, a in pairs])
        metrics.update(group_metrics)
        if metrics.get("skipped"):
            # nothing trainable (all truncated or without captured tokens): no new version
            with self.engine.begin() as conn:
                queries.mark_trained(conn, trajectory_ids=considered, step=-1)
                queries.set_state(conn, "baselines", self.baselines.state())
            log.info("batch of %d trajectories had nothing to train on", len(considered))
            return
        # unique: a step redone after a crash must not reuse a name vLLM may have served
        version = f"step-{step}-{os.urandom(3).hex()}"
        target = self.checkpoints / version
        if target.exists():
            # left by a run that died before recording this step: the database, not the
            # directory, says what was published, so the half-done attempt is redone
            shutil.rmtree(target)
        checkpoint = self._save(target)
        self._save_optimizer(checkpoint)
        result = self.publisher.publish(checkpoint, version, expected=self.trainer.logprobs_of)
        metrics.update(swap_seconds=result.swap_seconds, max_logprob_diff=result.max_logprob_diff)
        with self.engine.begin() as conn:
            ordinal = queries.next_ordinal(conn)
            queries.add_version(
                conn,
                version=version,
                ordinal=ordinal,
                parent=self.serving["version"],
                checkpoint_path=str(checkpoint),
                status="serving" if result.ok else "rolled_back",
                swap_seconds=result.swap_seconds,
                error=result.error,
                metrics=metrics,
            )
            queries.add_step(
                conn, step=step, version=version if result.ok else None, metrics=metrics
            )
            queries.mark_trained(conn, trajectory_ids=considered, step=step)
            queries.set_state(conn, "baselines", self.baselines.state())
            if result.ok:
                self.serving = queries.serving_version(conn)
        if not result.ok:
            self._roll_back(version, result.error)
        self.step = step
        log.info(
            "step %d: %d samples, %d tokens, reward %.3f, loss %.4f, clip %.3f, "
            "mismatch-kl %.2e, swap %.2fs -> %s",
            step,
            len(pairs),
            int(metrics.get("trained_tokens", 0)),
            group_metrics.get("mean_reward", float("nan")),
            metrics.get("loss", float("nan")),
            metrics.get("clip_fraction", float("nan")),
            metrics.get("mismatch_kl", float("nan")),
            result.swap_seconds,
            version if result.ok else f"ROLLED BACK ({result.error})",
        )

    def _publisher(self, probe: Probe, source: Path) -> FullReloadPublisher:
        # what the replicas hold besides any adapter: the full checkpoint under it
        base = lora_base(source)
        if not self.config.lora:
            return FullReloadPublisher(
                self.config.upstreams,
                probe=probe,
                tolerance=self.config.verify_tolerance,
                last_good=base,
            )
        return LoraPublisher(
            self.config.upstreams,
            probe=probe,
            tolerance=self.config.verify_tolerance,
            last_good=base,
            max_rank=self.config.lora_rank,
        )

    def _trainer(self, source: Path) -> Trainer:
        model: torch.nn.Module
        if self.config.lora:
            # an adapter trains on; full weights get a fresh adapter (B = 0: same policy)
            model = (
                load_trainable(source)
                if is_adapter(source)
                else wrap(load_model(source), self.lora_settings)
            )
        elif is_adapter(source):
            model = merge(load_trainable(source))  # LoRA switched off: train its merged weights
        else:
            model = load_model(source)
        # the KL term (kl_coef > 0) anchors to the base model, version 0; a LoRA model's
        # own base (adapter off) is that anchor when it was trained from version 0
        reference = None
        if self.trainer_config.loss.kl_coef > 0 and not self.config.lora:
            reference = load_model(self.checkpoints / "base")
        return Trainer(model, self.trainer_config, self.config.device, reference)

    def _save(self, target: Path) -> Path:
        assert self.trainer is not None and self.serving is not None
        if self.config.lora:
            serving = Path(self.serving["checkpoint_path"])
            return save_adapter(self.trainer.model, target, base_dir=lora_base(serving))
        return save_checkpoint(self.trainer.model, target, source_dir=self.model_dir)

    @staticmethod
    def _optimizer_path(checkpoint: Path) -> Path:
        # beside the directory vLLM loads, never inside it
        return checkpoint.with_name(checkpoint.name + ".optimizer.pt")

    def _save_optimizer(self, checkpoint: Path) -> None:
        assert self.trainer is not None
        path = self._optimizer_path(checkpoint)
        torch.save(self.trainer.optimizer.state_dict(), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)

    def _load_optimizer(self, checkpoint: Path) -> None:
        """AdamW moments of that checkpoint, so a resumed run continues the same run."""
        assert self.trainer is not None
        path = self._optimizer_path(checkpoint)
        if path.exists():
            try:
                self.trainer.optimizer.load_state_dict(torch.load(path, weights_only=True))
            except ValueError as exc:
                # saved for other parameters (LoRA switched on or off): start the moments anew
                log.warning("optimizer state %s does not fit (%s); starting afresh", path, exc)

    def _roll_back(self, failed: str, error: str | None) -> None:
        """The previous version keeps serving; the trainer returns to its weights."""
        assert self.serving is not None and self.publisher is not None
        previous = Path(self.serving["checkpoint_path"])
        log.error("version %s failed verification (%s); rolling back", failed, error)
        self.trainer = self._trainer(previous)
        self._load_optimizer(previous)
        result = self.publisher.rollback(
            previous, self.serving["version"], expected=self.trainer.logprobs_of
        )
        if not result.ok:
            log.error("rollback to %s failed too: %s", self.serving["version"], result.error)


def lora_base(checkpoint: Path) -> Path:
    """The full weights a checkpoint serves on: itself, or the base an adapter names."""
    return adapter_base(checkpoint) if is_adapter(checkpoint) else checkpoint


def rollback_to(config: LearnerConfig, version: str) -> str:
    """`onthejob rollback VERSION`: serve an earlier version again."""
    engine = db.make_engine(config.database_url)
    try:
        with engine.begin() as conn:
            target = queries.version(conn, version=version)
            if target is None or not target["checkpoint_path"]:
                raise ValueError(f"unknown policy version {version!r}")
            checkpoint = Path(target["checkpoint_path"])
            current = queries.serving_version(conn)
            # a new version (fresh ordinal) with the old weights: staleness keeps counting
            # forwards, and what the rolled-away versions produced counts as old
            ordinal = queries.next_ordinal(conn)
            label = f"{version}+rollback-{ordinal}"
            # what the replicas hold under any adapter; a full reload if that is not it
            served = None if current is None else lora_base(Path(current["checkpoint_path"]))
            probe = Probe(prompt_token_ids=[1])
            publisher = LoraPublisher(config.upstreams, probe=probe, last_good=served)
            weights = (
                load_trainable(checkpoint) if is_adapter(checkpoint) else load_model(checkpoint)
            )
            model = Trainer(weights, TrainerConfig(), config.device)
            result = publisher.rollback(checkpoint, label, expected=model.logprobs_of)
            if not result.ok:
                raise ValueError(f"rolling back to {version} failed: {result.error}")
            queries.add_version(
                conn,
                version=label,
                ordinal=ordinal,
                parent=None if current is None else current["version"],
                checkpoint_path=str(checkpoint),
                status="serving",
                swap_seconds=result.swap_seconds,
            )
            return label
    finally:
        engine.dispose()
