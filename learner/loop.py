"""`onthejob learn`: grade finished trajectories, run GRPO on their exact tokens, publish.

One iteration: grade what finished -> if enough trajectories carry a signal, one optimizer
step -> checkpoint -> hot-swap into every vLLM replica -> verify -> record -> serve. A version
that fails verification never serves anyone (learner/swap/publisher.py): the previous version
keeps serving and the trainer returns to its weights. Publishing holds the publish lease
(learner/swap/lease.py), so operators' rollbacks and the learner's publishes never interleave.

Invariant: a step is recorded, with the trajectories it trained on, in the transaction that
records its version, before anyone is served by it; whatever interrupts a step before that
(a crash, the database going away, an operator's rollback) leaves its batch untrained, the
running baselines without its rewards and the trainer back on the serving weights, so no
step is lost or done twice. Everything the learner needs to resume lives in the database
and the checkpoints.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.exc import DBAPIError
from tqdm import tqdm

from learner import control, grading, retention, selfjudge_rollouts
from learner.accounting import StepAccount
from learner.checkpoint import load_model, save_checkpoint
from learner.config import LearnerConfig
from learner.distributed import Ranks
from learner.grouping import (
    Baselines,
    GroupingConfig,
    Scored,
    bound_batch,
    compute_advantages,
    shuffle_rewards,
)
from learner.guard import GuardConfig
from learner.guard_run import Guard
from learner.layout import is_adapter, served_base
from learner.lora import LoraSettings, load_trainable, merge, save_adapter, wrap
from learner.loss import LossConfig
from learner.stopping import GracefulStop
from learner.swap import lease
from learner.swap.fence import Fence
from learner.swap.lora_publisher import LoraPublisher
from learner.swap.publisher import (
    HALF_PRECISION,
    HALF_PRECISION_CHECKED_TOLERANCE,
    ExpectedLogprobs,
    Fingerprint,
    FullReloadPublisher,
    Probe,
    PublishResult,
    current_version,
    served_adapters,
    served_dtype,
    tolerance_for,
)
from learner.swap.requests import SwapRequestWorker
from learner.swap.versions import serve_version
from learner.traffic import yielding_to
from learner.trainer import Trainer, TrainerConfig
from store import db, gates, grade_queue, learner_state, policy_versions, training_steps
from store.control import KNOBS, Control, read_heartbeat
from store.export import iter_trajectories
from store.guard_records import guard_decision, mark_rolled_back
from store.samples import Sample, build_samples
from store.tasks import TaskTable, upsert_tasks

log = logging.getLogger("onthejob.learner")

GRADE_BATCH = 256
STALE_BATCH = 4096  # trajectories recorded as too stale to grade at one time, at most
PENDING_RECHECK = 30.0  # seconds before trajectories waiting for feedback are graded again
PROBE_TEXT = "The quick brown fox jumps over the lazy dog."
LEASE_WAIT = 300.0  # seconds the learner waits for an operator's rollback to finish
LEARNER = "learner@"  # holder prefix: one learner per database, a restart takes over
SHADOW_ROLLOUTS_EVERY = 30.0  # seconds between looks at what rollout runners graded
RETRY_CAP = 10.0  # seconds between tries at most, while the database or vLLM is away


class RestoreFailed(RuntimeError):
    """The replicas could not be made to serve what the store says serves (yet)."""


class Learner:
    def __init__(self, config: LearnerConfig, ranks: Ranks | None = None) -> None:
        """`ranks`: this is rank 0 of several (torchrun), which train the model sharded
        (learner/distributed.py); everything else is this process's alone."""
        if ranks is not None and config.lora:
            raise ValueError("--lora trains on one device: launch it without torchrun")
        self.config = config
        self.ranks = ranks
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        if ranks is not None:
            log.info("training sharded over %d ranks (FSDP2) on %s", ranks.world, ranks.device)
        db.upgrade(config.database_url)
        self.engine = db.make_engine(config.database_url)
        self.model_dir = Path(config.model)
        self.checkpoints = Path(config.checkpoints)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.grader: Any = grading.learner_grader(config, self.engine)
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
            logprob_chunk_tokens=config.logprob_chunk_tokens,
            activation_checkpointing=config.activation_checkpointing,
            mask_truncated=config.mask_truncated,
            max_sequence_mismatch=config.max_sequence_mismatch,
            loss=LossConfig(
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                max_importance_weight=config.max_importance_weight,
                kl_coef=config.kl_coef,
                clip_against=config.clip_against,
            ),
        )
        self.retry_policy = grading.RetryPolicy(
            base=config.grade_retry_base,
            cap=config.grade_retry_cap,
            max_attempts=config.grade_max_attempts,
        )
        self.tasks = TaskTable()
        self.trainer: Trainer | None = None
        self.publisher: FullReloadPublisher | None = None
        self.guard: Guard | None = None
        self.serving: dict[str, Any] | None = None
        self.baselines = Baselines.fresh(config.type_baseline)
        self.step = 0
        self.holder = lease.holder_name(LEARNER.rstrip("@"))
        self.fence = Fence(self.engine, self.holder, drain_timeout=config.swap_drain_timeout)
        # the knobs as the command line (and config, environment) set them; the operator's
        # live values override them (learner/control.py)
        self.own_knobs = {name: getattr(config, name) for name in KNOBS}
        self.own_set_at: dict[str, str] = {}
        self.applied_control = Control()  # what operators asked, as last applied
        self.activity = "starting"  # what the heartbeat says the learner is doing
        self.heartbeat = control.Heartbeat(self)
        # a stop (signal, or `stopping.request()` from another thread) never cuts a swap short
        self.stopping = GracefulStop()
        self._needs_restore = False
        self._grading: tqdm | None = None
        self._rollouts_shadowed_at = -float("inf")
        self._pending: set[str] = set()
        self._pending_since = time.monotonic()
        # the last batch a step took, accounted (StepAccount.metrics): the heartbeat shows it
        self.last_batch: dict[str, Any] | None = None
        # a ready step waits for busy replicas to go idle (--yield-to-traffic)
        self.traffic = yielding_to(config.upstreams, config.yield_to_traffic)
        # the trainer holds exactly the serving checkpoint's weights and optimizer state (not
        # a step nobody recorded, nor a model half loaded): only then may a stop save it
        self._trainer_is_serving = False

    # -- start-up ---------------------------------------------------------------------
    def start(self) -> None:
        if self.config.tasks:
            self._load_tasks(Path(self.config.tasks))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.probe = Probe(prompt_token_ids=list(tokenizer(PROBE_TEXT)["input_ids"]))
        dtypes = {served_dtype(upstream) for upstream in self.config.upstreams}
        checker = FullReloadPublisher(self.config.upstreams, probe=self.probe)
        why_not = checker.weights_checkable(self.model_dir)
        self.weights_checked = why_not is None
        self.tolerance = self._verify_tolerance(dtypes, why_not)
        self.trainer_config = dataclasses.replace(
            self.trainer_config, precision=self._precision(dtypes)
        )
        # a learner killed mid-publish left its lease behind: take it over at once
        with lease.held(self.engine, self.holder, wait=LEASE_WAIT, steal_prefix=LEARNER):
            with self.engine.begin() as conn:
                self.serving = policy_versions.serving_version(conn)
                self.step = training_steps.last_step(conn)
                states = {key: learner_state.get_state(conn, key) for key in Baselines.KEYS}
                self.baselines = Baselines.from_states(states, self.config.type_baseline)
                self.own_set_at = control.own_set_at(self.own_knobs, read_heartbeat(conn))
            adopted = self.serving is None and self._adopt_served_weights()
            assert self.serving is not None
            source = Path(self.serving["checkpoint_path"])
            if self.trainer is None:
                self.trainer = self._trainer(source)
            self._load_optimizer(source)
            self._trainer_is_serving = True
            self.publisher = self._publisher(source)
            if not adopted:
                # always swap in what the database says serves, verified: a learner that died
                # mid-swap may have left a replica fenced off or holding unpublished weights
                self._restore_locked()
        log.info(
            "learner ready: serving %s (step %d), graders %s, traffic of %s",
            self.serving["version"],
            self.step,
            ", ".join(self.config.graders),
            "the client keys " + ", ".join(self.config.keys) if self.config.keys else "everyone",
        )
        if self.config.guard:
            self._start_guard(Path(self.config.guard))

    def _start_guard(self, path: Path) -> None:
        """The regression guard: the serving version's scores are the baseline; one that
        served before the guard could judge it (the learner stopped in between) is judged
        now against its parent's."""
        assert self.serving is not None
        self.guard = Guard(
            GuardConfig.load(path),
            self.engine,
            self.config.database_url,
            activity=lambda text: setattr(self, "activity", text),
        )
        parent = self._parent()
        if self.guard.known(self.serving) is None and parent and self.guard.known(parent):
            self._guard_step(None)
        else:
            self.guard.baseline(self.serving)

    def _parent(self) -> dict[str, Any] | None:
        assert self.serving is not None
        if not self.serving["parent"]:
            return None
        with self.engine.connect() as conn:
            return policy_versions.version(conn, version=self.serving["parent"])

    def _guard_step(self, step: int | None) -> None:
        """Judge the version that just started serving; roll it back to its parent (the last
        kept version) if it regressed a guarded type."""
        assert self.guard is not None and self.serving is not None
        candidate, kept = self.serving, self._parent()
        if kept is None:
            return
        decision = self.guard.check(candidate, kept, step=step)
        if decision.outcome != "rolled_back":
            return
        with self.engine.connect() as conn:
            now_serving = policy_versions.serving_version(conn)
        if now_serving is None or now_serving["version"] != candidate["version"]:
            # an operator changed what serves during the evals: theirs is the last word
            log.warning("guard: %s no longer serves; not rolled back", candidate["version"])
            return
        self.activity = f"guard: rolling {candidate['version']} back to {kept['version']}"
        # a stop asked for meanwhile comes once the rollback is recorded as the guard's
        with self.stopping.swap():
            label = serve_version(
                self.engine,
                self.config.upstreams,
                kept["version"],
                action="rollback",
                lease_wait=LEASE_WAIT,
                drain_timeout=self.config.swap_drain_timeout,
            )
            with self.engine.begin() as conn:
                recorded = guard_decision(conn, candidate["version"])
                mark_rolled_back(
                    conn, version=candidate["version"], serving=label, decision=recorded
                )
                serving = policy_versions.serving_version(conn)
        log.warning(
            "guard: %s rolled back to %s, serving as %s: %s",
            candidate["version"],
            kept["version"],
            label,
            decision.reason,
        )
        assert serving is not None
        self._follow(serving, by="the regression guard")

    def _verify_tolerance(self, dtypes: set[str | None], unchecked: str | None) -> float:
        """The probe tolerance: the configured one, else the one for the dtype the replicas
        serve in (the loosest, should they differ). ``unchecked``: why the weights cannot be
        compared exactly (None: they are, at every swap)."""
        log.info(
            "vLLM serves in %s; %s",
            ", ".join(map(str, dtypes)),
            "its weights are compared exactly with each checkpoint's"
            if unchecked is None
            else f"the probe alone verifies swaps, no exact weight check ({unchecked})",
        )
        if self.config.verify_tolerance is not None:
            return self.config.verify_tolerance
        tolerance = max(tolerance_for(dtype) for dtype in dtypes)
        if unchecked is None and dtypes & set(HALF_PRECISION):
            log.info(
                "swaps verify the probe within %g, within %g once the weights matched",
                tolerance,
                HALF_PRECISION_CHECKED_TOLERANCE,
            )
        else:
            log.info("swaps verify the probe within %g", tolerance)
        return tolerance

    def _precision(self, dtypes: set[str | None]) -> str:
        """What the trainer computes in: the configured precision, else bf16 (with float32
        masters: the full weights, or a LoRA adapter on its bf16 base) when every replica
        serves bf16, so checkpoints hold exactly the weights the trainer scores with."""
        precision = self.config.precision
        if precision == "auto":
            precision = "bfloat16" if dtypes == {"bfloat16"} else "float32"
        log.info("the trainer computes in %s", precision)
        return precision

    def _adopt_served_weights(self) -> bool:
        """First start: the weights vLLM serves now become version 0, with the probe they
        pass; its checkpoint is written by us so it always holds lm_head.weight (a rollback
        to it must be exact). False when vLLM serves something else (an adapter of another
        run, other weights): version 0 is then the base, swapped in like after a crash."""
        base = self.checkpoints / "base"
        if not base.exists():
            save_checkpoint(load_model(self.model_dir), base, source_dir=self.model_dir)
        self.trainer = self._trainer(base)
        fingerprint = Fingerprint.of(self.probe, self.trainer.logprobs_of, self.tolerance)
        version = current_version(self.config.upstreams[0])
        serves_base = version not in served_adapters(self.config.upstreams[0])
        if serves_base:
            checker = FullReloadPublisher(
                self.config.upstreams, probe=self.probe, check_weights=self.weights_checked
            )
            for upstream in self.config.upstreams:
                why = checker.serves(upstream, base, fingerprint)
                if why is not None:
                    log.warning(
                        "%s does not serve --model's weights (%s): swapping them in", upstream, why
                    )
                    serves_base = False
        if not serves_base:
            version = f"base-{os.urandom(3).hex()}"
        with self.engine.begin() as conn:
            policy_versions.add_version(
                conn,
                version=version,
                ordinal=policy_versions.next_ordinal(conn),
                parent=None,
                checkpoint_path=str(base),
                status="serving",
                probe=fingerprint.state(),
            )
            self.serving = policy_versions.serving_version(conn)
        return serves_base

    def _restore(self) -> None:
        """Make every replica serve what the database says serves, verified."""
        self.activity = "restoring the serving version"
        with lease.held(self.engine, self.holder, wait=LEASE_WAIT):
            self._restore_locked()

    def _restore_locked(self) -> None:
        with self.stopping.swap():
            self._restore_verified()

    def _restore_verified(self) -> None:
        assert self.serving is not None and self.publisher is not None
        assert self.trainer is not None
        with self.engine.connect() as conn:
            serving = policy_versions.serving_version(conn)
        assert serving is not None
        if serving["version"] != self.serving["version"]:
            self._follow(serving)
        fingerprint = Fingerprint.from_state(serving["probe"], at_least=self.tolerance)
        result = self.publisher.rollback(
            Path(serving["checkpoint_path"]),
            serving["version"],
            fingerprint=fingerprint,
            expected=None if fingerprint is not None else self.trainer.logprobs_of,
        )
        if not (result.ok and result.opened):
            self._needs_restore = True
            raise RestoreFailed(f"could not restore {serving['version']}: {result.error}")
        if fingerprint is None and result.fingerprint is not None:
            with self.engine.begin() as conn:
                policy_versions.set_version_probe(
                    conn, version=serving["version"], probe=result.fingerprint.state()
                )
            self.serving["probe"] = result.fingerprint.state()
            self.publisher.last_good_fingerprint = result.fingerprint
        self._needs_restore = False

    def _gates_left_closed(self) -> bool:
        """A publisher that died mid-swap (nobody holds the lease) left replicas fenced off."""
        with self.engine.connect() as conn:
            closed = {g["upstream"] for g in gates.closed_gates(conn)}
        return bool(closed & set(self.publisher.upstreams if self.publisher else [])) and (
            lease.who(self.engine) is None
        )

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
            upsert_tasks(conn, rows)
            grade_queue.retry_failed_now(conn)  # "no reference answer" may have one now
        self.tasks = table
        log.info("loaded %d tasks from %s", len(rows), path)

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        self.start()
        self.heartbeat.start()
        # the admin API's rollbacks and promotes: the learner carries out every swap
        requests = SwapRequestWorker(
            self.engine, self.config.upstreams, drain_timeout=self.config.swap_drain_timeout
        ).start()
        failures = 0
        try:
            while not self.stopping.requested and (
                self.config.max_steps is None or self.step < self.config.max_steps
            ):
                try:
                    self.iterate()
                    failures = 0
                except (DBAPIError, RestoreFailed) as exc:
                    if isinstance(exc, DBAPIError) and not _unreachable(exc):
                        raise  # a refused statement is a bug, not an outage
                    failures += 1
                    # back off, but look again soon: the sooner it is back, the better
                    wait = min(self.config.poll_interval * 2.0**failures, RETRY_CAP)
                    self.activity = f"retrying in {wait:g}s: {_first_line(exc)}"
                    log.warning("%s; trying again in %gs", _first_line(exc), wait)
                    self.stopping.wait(wait)
        finally:
            requests.stop()
            self.heartbeat.stop()
            self._save_optimizer_at_stop()

    def _save_optimizer_at_stop(self) -> None:
        """The serving checkpoint's optimizer state, if no step wrote it (they do every
        --optimizer-state-every steps): a restart after a clean stop continues the same run.
        Only while the trainer holds exactly that checkpoint's state: a stop that came
        mid-step (or mid-reload) must not pass a step nobody recorded off as the serving
        one's. Not for version 0 (nothing trained yet), nor under FSDP (its ranks are gone)."""
        if not self._trainer_is_serving or self.ranks is not None:
            return
        assert self.trainer is not None and self.serving is not None
        checkpoint = Path(self.serving["checkpoint_path"])
        if (
            not self.serving["ordinal"]
            or not checkpoint.is_dir()
            or self._optimizer_path(checkpoint).exists()
        ):
            return
        try:
            started = time.monotonic()
            self._save_optimizer(checkpoint)
            log.info(
                "optimizer state of %s saved in %.1fs", checkpoint.name, time.monotonic() - started
            )
        except Exception as exc:  # a stop goes on; a resume says what it lacks
            log.warning("could not save the optimizer state at stop: %s", exc)

    def iterate(self) -> None:
        """One look at the world: restore what serves if it needs it, follow the operator,
        grade, maybe train."""
        if self.ranks is not None:
            self.ranks.keepalive()
        if self._needs_restore or self._gates_left_closed():
            self._restore()
        if control.follow(self):  # operator pause and live knobs (admin API)
            self.traffic.reset()  # a pause is no wait for idle replicas
            return
        self.activity = "grading"
        graded = self.grade_finished()
        if time.monotonic() - self._rollouts_shadowed_at > SHADOW_ROLLOUTS_EVERY:
            # the runners' grades (checks): the self-judge's agreement with them
            self._rollouts_shadowed_at = time.monotonic()
            selfjudge_rollouts.shadow_rollout_grades(self.engine, self.grader, self.tasks)
        trained = self.maybe_train()
        if not graded and not trained:
            self.activity = "waiting for trajectories"
            self.stopping.wait(self.config.poll_interval)

    def grade_finished(self) -> int:
        """Grade what finished (and failed gradings now due again), newest first; how many
        were saved, with those too stale to train on, recorded without a grader call."""
        skipped = self.skip_stale()
        with self.engine.connect() as conn:
            if time.monotonic() - self._pending_since > PENDING_RECHECK:
                # feedback may have arrived for what was waiting: look at it again
                self._pending, self._pending_since = set(), time.monotonic()
            keys = self.config.keys
            ids = grade_queue.ungraded_finished(
                conn, limit=GRADE_BATCH, skip=sorted(self._pending), keys=keys
            )
            backlog = (
                grade_queue.count_ungraded_finished(conn, keys=keys)
                if len(ids) == GRADE_BATCH
                else 0
            )
        if backlog > GRADE_BATCH and self._grading is None:
            # a long phase (e.g. a learner started on a full database): show progress
            self._grading = tqdm(total=backlog, desc="grading", unit="trajectory")
        if not ids:
            return skipped
        trajectories = list(iter_trajectories(self.engine, ids=ids))
        outcome = grading.grade_and_save(
            self.engine, self.grader, trajectories, tasks=self.tasks, policy=self.retry_policy
        )
        self._pending.update(outcome.pending)  # not before the next recheck
        if self._grading is not None:
            self._grading.update(len(trajectories))
            if len(ids) < GRADE_BATCH:
                self._grading.close()
                self._grading = None
        return outcome.saved + skipped

    def skip_stale(self) -> int:
        """Record the ungraded trajectories served more than max_staleness versions before
        the serving one as not graded: no step could train on them (grouping drops them),
        and a learner that fell behind would otherwise spend its grader calls on them first.
        The next step counts them (`stale_not_graded`). How many there were."""
        staleness = self.grouping.max_staleness
        with self.engine.begin() as conn:
            serving = policy_versions.serving_version(conn)
            if serving is None or serving["ordinal"] is None:
                return 0
            below = int(serving["ordinal"]) - staleness
            if below <= 0:  # ordinals start at 0: nothing can be that old yet
                return 0
            ids = grade_queue.stale_ungraded(
                conn, below_ordinal=below, limit=STALE_BATCH, keys=self.config.keys
            )
            detail = {
                "not_graded": "stale",
                "serving_ordinal": int(serving["ordinal"]),
                "max_staleness": staleness,
            }
            grade_queue.skip_stale(conn, trajectory_ids=ids, detail=detail)
        if ids:
            log.info(
                "%d finished trajectories are more than %d versions older than the serving "
                "one: not graded",
                len(ids),
                staleness,
            )
        return len(ids)

    def _follow_operator(self) -> None:
        """`onthejob rollback` may have changed what serves: train on from there."""
        assert self.serving is not None
        with self.engine.connect() as conn:
            serving = policy_versions.serving_version(conn)
        if serving is not None and serving["version"] != self.serving["version"]:
            self._follow(serving)

    def _follow(self, serving: dict[str, Any], by: str = "an operator") -> None:
        """What serves changed under us (an operator, the guard): the trainer and the
        publisher's idea of the last good weights move to it."""
        log.info("now serving %s (changed by %s); training from it", serving["version"], by)
        self._trainer_is_serving = False
        source = Path(serving["checkpoint_path"])
        self.trainer = self._trainer(source)
        self.serving = serving
        self._load_optimizer(source)
        self._trainer_is_serving = True
        if self.publisher is not None:
            self.publisher.last_good = served_base(source).resolve()
            self.publisher.last_good_fingerprint = Fingerprint.from_state(
                serving["probe"], at_least=self.tolerance
            )

    def _reload_trainer(self) -> None:
        """Back to the serving weights and their optimizer state (a step nobody recorded)."""
        assert self.serving is not None
        self._trainer_is_serving = False
        source = Path(self.serving["checkpoint_path"])
        self.trainer = self._trainer(source)
        self._load_optimizer(source)
        self._trainer_is_serving = True

    def maybe_train(self) -> bool:
        self._follow_operator()
        with self.engine.connect() as conn:
            waiting = grade_queue.incomplete_groups(conn)
            trainable = grade_queue.trainable_grades(conn, keys=self.config.keys)
            rows = [r for r in trainable if r["group_key"] not in waiting]
            ordinals = policy_versions.version_ordinals(conn)
        if not rows:
            self.traffic.reset()
            return False
        assert self.serving is not None
        current = int(self.serving["ordinal"])
        # traffic of a version that is not a verified one (an unknown label, a call recorded
        # before the proxy knew the version) is not trainable: nothing says which weights
        # produced it
        unknown = [r["trajectory_id"] for r in rows if r["policy_version"] not in ordinals]
        scored = [
            Scored(
                trajectory_id=r["trajectory_id"],
                task_key=r["task_key"] or r["trajectory_id"],
                reward=float(r["reward"]),
                version_index=ordinals[r["policy_version"]],
                group_id=r["group_key"],
                interaction_type=r["interaction_type"],
            )
            for r in rows
            if r["policy_version"] in ordinals
        ]
        if self.config.shuffle_rewards:
            scored = shuffle_rewards(scored)
        # on a copy: the same rows come back at every poll until a step consumes them, and
        # the learner takes the copy only once a record says so (a step tried again after a
        # fault must not fold its rewards in twice)
        baselines, advantaged, group_metrics = self._advantages(scored, current)
        if len(advantaged) < self.config.batch_trajectories:
            self.traffic.reset()
            return False
        if self.traffic.should_wait():
            # vLLM is generating on the cores (or GPU) the step would take: grade on, and
            # train on everything graded meanwhile once it is idle
            self.activity = (
                f"step ready, waiting for idle replicas ({self.traffic.busy:g} requests, "
                f"{self.traffic.waited():.0f}s of {self.config.yield_to_traffic:g}s)"
            )
            return False
        waited = self.traffic.took()
        # at most max_batch_trajectories with a signal: the newest whole groups; the others
        # stay untrained (not considered, not marked) for a later step, or to grow stale
        scored, waiting = bound_batch(
            scored,
            advantaged,
            limit=self._batch_limit(),
            oldest=current - self.grouping.max_staleness,
        )
        if waiting:
            # the batch's advantages and baselines without what waits: the step that takes
            # it folds its rewards in
            baselines, advantaged, group_metrics = self._advantages(scored, current)
        # the step also accounts for what was too stale to grade (read only when a step will
        # happen: this runs at every poll)
        with self.engine.connect() as conn:
            stale = grade_queue.stale_skipped(conn, keys=self.config.keys)
        group_metrics["stale_not_graded"] = float(len(stale))
        group_metrics["yield_seconds"] = round(waited, 2)
        group_metrics["dropped_unknown_version"] = float(len(unknown))
        considered = [s.trajectory_id for s in scored] + unknown + stale
        self._train(advantaged, considered, group_metrics, baselines, waiting=len(waiting))
        return True

    def _advantages(
        self, scored: list[Scored], current: int
    ) -> tuple[Baselines, list[Any], dict[str, Any]]:
        """Advantages and grouping metrics of `scored`, with a copy of the baselines that
        has their rewards folded in."""
        baselines = self.baselines.copy()
        advantaged, group_metrics = compute_advantages(
            scored,
            current_version_index=current,
            baselines=baselines.tasks,
            type_baselines=baselines.types,
            config=self.grouping,
        )
        return baselines, advantaged, dict(group_metrics)

    def _batch_limit(self) -> int:
        """Trajectories with a signal a step trains on at most (0: no bound): never fewer
        than a step waits for (both are live knobs)."""
        bound = self.config.max_batch_trajectories
        return 0 if bound <= 0 else max(bound, self.config.batch_trajectories)

    def _train(
        self,
        advantaged: list[Any],
        considered: list[str],
        group_metrics: dict[str, float],
        baselines: Baselines,
        *,
        waiting: int = 0,
    ) -> None:
        """One step on `advantaged`; `considered`: every trajectory it consumes (marked with
        the step); `waiting`: how many with a signal were left for a later step."""
        assert self.trainer is not None and self.publisher is not None and self.serving
        account = StepAccount.of_grouping(
            group_metrics, considered=len(considered), waiting=waiting
        )
        advantage_of = {a.trajectory_id: a.advantage for a in advantaged}
        trajectories = list(iter_trajectories(self.engine, ids=list(advantage_of)))
        samples: list[Sample] = []
        advantages: list[float] = []
        skipped: Counter[str] = Counter()  # calls not trained on, by reason
        for trajectory in trajectories:
            for sample in build_samples(trajectory, skipped=skipped):
                samples.append(sample)
                advantages.append(advantage_of[trajectory["id"]])
        pairs: list[tuple[Sample, float]] = []
        left_out: Counter[str] = Counter()  # samples the trainer is not given, by reason
        for sample, advantage in zip(samples, advantages, strict=True):
            why = self.trainer.untrainable(sample)
            if why is None:
                pairs.append((sample, advantage))
            else:
                left_out[why] += 1
        account.built(
            calls_skipped=skipped,
            samples=len(samples),
            dropped=left_out,
            trajectories=len({s.trajectory_id for s, _ in pairs}),
        )
        step = self.step + 1
        self.activity = f"training step {step}"
        # the knob as the operator or the command line last set it, whatever the optimizer
        # state loaded from a checkpoint says
        self.trainer.set_learning_rate(self.config.learning_rate)
        self._trainer_is_serving = False  # until a record says what it holds
        metrics = self.trainer.step(
            [s for s, _ in pairs], [a for _, a in pairs], fresh_version=self.serving["version"]
        )
        account.trained(metrics)
        metrics.update(
            group_metrics,
            learning_rate=self.config.learning_rate,
            skipped_calls=dict(skipped),
            **account.metrics(),
        )
        # one assignment: the heartbeat thread reads it
        self.last_batch = {"step": step, "trained": not metrics.get("skipped"), **account.metrics()}
        if metrics.get("skipped"):
            # nothing trainable (all truncated, without captured tokens, or mismatched): no
            # new version, and no optimizer step
            self._trainer_is_serving = True
            with self.engine.begin() as conn:
                grade_queue.mark_trained(conn, trajectory_ids=considered, step=-1)
                _save_baselines(conn, baselines)
            self.baselines = baselines
            log.warning(
                "batch of %d trajectories had nothing to train on: %s",
                len(considered),
                account.summary(),
            )
            return
        if account.low:
            log.warning("step %d %s", step, account.warning())
        try:
            result = self._publish_step(step, metrics, considered, baselines)
        except BaseException:
            if self.step < step:
                # the optimizer stepped, but no record says so: back to the serving weights,
                # so the step is neither lost nor done twice (its batch is trained again)
                self._reload_trainer()
            raise
        if result is None:
            return  # an operator changed what serves meanwhile: trained again from there
        log.info(
            "step %d: %s; %d tokens, reward %.3f, lr %.3g, loss %.4f, clip %.3f "
            "(behaviour %.3f), ratio %.4f [%.4f, %.4f], mismatch-kl %.2e (fresh %.2e over %d "
            "tokens); waited %.1fs for idle replicas, trained in %.1fs, saved in %.1fs "
            "(optimizer state %.1fs), swap %.2fs (verified: %d weight sums exact, probe "
            "within %.3g) -> %s",
            step,
            account.summary(),
            int(metrics.get("trained_tokens", 0)),
            group_metrics.get("mean_reward", float("nan")),
            self.config.learning_rate,
            metrics.get("loss", float("nan")),
            metrics.get("clip_fraction", float("nan")),
            metrics.get("behaviour_clip_fraction", float("nan")),
            metrics.get("ratio_mean", float("nan")),
            metrics.get("ratio_min", float("nan")),
            metrics.get("ratio_max", float("nan")),
            metrics.get("mismatch_kl", float("nan")),
            metrics.get("fresh_mismatch_kl", float("nan")),
            int(metrics.get("fresh_tokens", 0)),
            metrics.get("yield_seconds", 0.0),
            metrics.get("step_seconds", float("nan")),
            metrics.get("save_seconds", float("nan")),
            metrics.get("optimizer_state_seconds", float("nan")),
            result.swap_seconds,
            result.weight_sums_compared,
            result.max_logprob_diff if result.max_logprob_diff is not None else float("nan"),
            result.version if result.ok else f"NOT PUBLISHED ({result.error})",
        )
        if result.ok and self.guard is not None:
            self._guard_step(step)

    def _publish_step(
        self,
        step: int,
        metrics: dict[str, Any],
        considered: list[str],
        baselines: Baselines,
    ) -> PublishResult | None:
        """Checkpoint, publish and record one step under the publish lease; None when an
        operator changed what serves while it trained (the step is dropped). The learner's
        step, serving version and baselines follow the record as soon as it commits, so
        that nothing after it (the store or vLLM going away) can make it train again."""
        assert self.trainer is not None and self.publisher is not None and self.serving
        self.activity = f"publishing step {step}"
        with lease.held(self.engine, self.holder, wait=LEASE_WAIT):
            with self.engine.connect() as conn:
                serving = policy_versions.serving_version(conn)
            if serving is not None and serving["version"] != self.serving["version"]:
                log.info("step %d trained on weights an operator replaced: dropped", step)
                self._follow(serving)
                return None
            # unique: a step redone after a crash must not reuse a name vLLM may have served
            version = f"step-{step}-{os.urandom(3).hex()}"
            target = self.checkpoints / version
            if target.exists():
                # left by a run that died before recording this step: the database, not the
                # directory, says what was published, so the half-done attempt is redone
                shutil.rmtree(target)
            saving = time.monotonic()
            checkpoint = self._save(target)
            saved = time.monotonic()
            every = self.config.optimizer_state_every
            if every > 0 and step % every == 0:
                self._save_optimizer(checkpoint)
            metrics.update(
                save_seconds=round(saved - saving, 3),
                optimizer_state_seconds=round(time.monotonic() - saved, 3),
            )
            parent = self.serving["version"]

            def record(result: PublishResult) -> None:
                """Verified, not yet serving: the version, the step and its batch, at once."""
                metrics.update(
                    swap_seconds=result.swap_seconds,
                    max_logprob_diff=result.max_logprob_diff,
                    weight_sums_compared=result.weight_sums_compared,
                )
                with self.engine.begin() as conn:
                    policy_versions.add_version(
                        conn,
                        version=version,
                        ordinal=policy_versions.next_ordinal(conn),
                        parent=parent,
                        checkpoint_path=str(checkpoint),
                        status="serving",
                        swap_seconds=result.swap_seconds,
                        metrics=metrics,
                        probe=None if result.fingerprint is None else result.fingerprint.state(),
                    )
                    self._record_step(conn, step, version, metrics, considered, baselines)
                    recorded = policy_versions.version(conn, version=version)
                self.step, self.serving, self.baselines = step, recorded, baselines
                self._trainer_is_serving = True

            # a stop asked for from here on comes once the outcome is recorded (stopping.py)
            with self.stopping.swap():
                try:
                    result = self.publisher.publish(
                        checkpoint, version, expected=self.trainer.logprobs_of, commit=record
                    )
                except BaseException:
                    self._needs_restore = True  # the replicas may still be fenced off
                    raise
                if result.ok:
                    self._needs_restore = not result.opened
                    self._prune()
                    return result
                metrics.update(
                    swap_seconds=result.swap_seconds,
                    max_logprob_diff=result.max_logprob_diff,
                    weight_sums_compared=result.weight_sums_compared,
                )
                with self.engine.begin() as conn:
                    # no ordinal: it never served anyone, nothing it did is trainable
                    policy_versions.add_version(
                        conn,
                        version=version,
                        ordinal=None,
                        parent=parent,
                        checkpoint_path=str(checkpoint),
                        status="rolled_back",
                        swap_seconds=result.swap_seconds,
                        error=result.error,
                        metrics=metrics,
                    )
                    self._record_step(conn, step, None, metrics, considered, baselines)
                self.step, self.baselines = step, baselines
                log.error("version %s failed (%s); %s keeps serving", version, result.error, parent)
                self._reload_trainer()
                self._needs_restore = not result.restored
                self._prune()
                return result

    def _prune(self) -> None:
        """Checkpoint retention, under the publish lease the caller holds."""
        try:
            retention.prune(
                self.engine,
                checkpoints=self.checkpoints,
                keep_last=self.config.keep_checkpoints,
                upstreams=self.config.upstreams,
            )
        except OSError as exc:
            log.warning("checkpoint retention failed (tried again next step): %s", exc)

    def _record_step(
        self,
        conn: Any,
        step: int,
        version: str | None,
        metrics: dict[str, Any],
        considered: list[str],
        baselines: Baselines,
    ) -> None:
        training_steps.add_step(conn, step=step, version=version, metrics=metrics)
        grade_queue.mark_trained(conn, trajectory_ids=considered, step=step)
        _save_baselines(conn, baselines)

    def _publisher(self, source: Path) -> FullReloadPublisher:
        assert self.serving is not None
        # what the replicas hold besides any adapter: the full checkpoint under it
        base = served_base(source)
        settings: dict[str, Any] = {
            "probe": self.probe,
            "tolerance": self.tolerance,
            "last_good": base,
            "last_good_fingerprint": Fingerprint.from_state(
                self.serving["probe"], at_least=self.tolerance
            ),
            "fence": self.fence,
            "check_weights": self.weights_checked,
            # a configured tolerance is kept as it is
            "checked_probe_tolerance": None
            if self.config.verify_tolerance is not None
            else HALF_PRECISION_CHECKED_TOLERANCE,
        }
        if not self.config.lora:
            return FullReloadPublisher(self.config.upstreams, **settings)
        return LoraPublisher(self.config.upstreams, max_rank=self.config.lora_rank, **settings)

    def _trainer(self, source: Path) -> Trainer:
        if self.ranks is not None:
            # every rank builds its shard of the trainer from the checkpoint
            base = self.checkpoints / "base" if self.trainer_config.loss.kl_coef > 0 else None
            return self.ranks.build(source, self.trainer_config, base)  # type: ignore[return-value]
        model: torch.nn.Module
        if self.config.lora:
            # under bf16 the frozen base is loaded as it is served, never in float32
            bf16 = self.trainer_config.precision == "bfloat16"
            base_dtype = torch.bfloat16 if bf16 else torch.float32
            # an adapter trains on; full weights get a fresh adapter (B = 0: same policy)
            model = (
                load_trainable(source, base_dtype)
                if is_adapter(source)
                else wrap(load_model(source, base_dtype), self.lora_settings)
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
            # the adapter vLLM is to serve: under bf16 the copy the trainer scores with (its
            # float32 masters go beside, in the training state)
            adapter = self.trainer.served_model
            return save_adapter(adapter, target, base_dir=served_base(serving))  # type: ignore[arg-type]
        return save_checkpoint(
            self.trainer.model,
            target,
            source_dir=self.model_dir,
            state=self.trainer.checkpoint_state(),
        )

    @staticmethod
    def _optimizer_path(checkpoint: Path) -> Path:
        # beside the directory vLLM loads, never inside it
        return checkpoint.with_name(checkpoint.name + ".optimizer.pt")

    def _save_optimizer(self, checkpoint: Path) -> None:
        assert self.trainer is not None
        path = self._optimizer_path(checkpoint)
        # AdamW's moments and, under bf16, the float32 master weights
        torch.save(self.trainer.training_state(), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)

    def _load_optimizer(self, checkpoint: Path) -> None:
        """AdamW moments of that checkpoint, so a resumed run continues the same run; the
        learning rate stays the one the operator or the command line set (the saved state
        carries the rate it was saved with)."""
        assert self.trainer is not None
        path = self._optimizer_path(checkpoint)
        if not path.exists() and self.step > 0:
            # written every --optimizer-state-every steps and at a clean stop: after a crash
            # (or a failed publish) the run goes on from the checkpoint's weights
            log.warning(
                "no optimizer state beside %s (--optimizer-state-every %d; and at a clean "
                "stop): AdamW moments start afresh%s",
                checkpoint.name,
                self.config.optimizer_state_every,
                ", from its bf16 weights" if self.trainer_config.precision == "bfloat16" else "",
            )
        if path.exists():
            try:
                self.trainer.load_training_state(torch.load(path, weights_only=True))
            except ValueError as exc:
                # saved for other parameters (LoRA switched on or off): start the moments anew
                log.warning("optimizer state %s does not fit (%s); starting afresh", path, exc)
        self.trainer.set_learning_rate(self.config.learning_rate)


def expected_for(checkpoint: Path) -> tuple[Probe, ExpectedLogprobs]:
    """`onthejob rollback` of a version recorded before probes were kept: its model, loaded,
    and the learner's probe for it."""
    from transformers import AutoTokenizer

    weights = load_trainable(checkpoint) if is_adapter(checkpoint) else load_model(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(served_base(checkpoint)))
    probe = Probe(prompt_token_ids=list(tokenizer(PROBE_TEXT)["input_ids"]))
    return probe, Trainer(weights, TrainerConfig(), None).logprobs_of


def _save_baselines(conn: Any, baselines: Baselines) -> None:
    for key, state in baselines.states().items():
        learner_state.set_state(conn, key, state)


def _unreachable(exc: DBAPIError) -> bool:
    """The database is away (refused, dropped, restarting), as opposed to refusing a query."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
