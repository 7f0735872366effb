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

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.exc import DBAPIError
from tqdm import tqdm

from learner import control, grading, shadow_judging
from learner.config import LearnerConfig
from learner.distributed import Ranks
from learner.fresh_wait import FreshWait
from learner.grouping import Baselines, GroupingConfig
from learner.guard import GuardConfig
from learner.guard_run import Guard
from learner.hindsight import HintFrame
from learner.loop.base import LEARNER, Publisher, RestoreFailed
from learner.loop.grading import Grading
from learner.loop.guarding import Guarding
from learner.loop.publish import Publishing
from learner.loop.startup import StartUp
from learner.loop.step import Stepping
from learner.loop.tenants import Tenants
from learner.loop.weights import Weights
from learner.lora import LoraSettings
from learner.loss import LossConfig
from learner.signals import SignalWeights
from learner.stopping import GracefulStop
from learner.swap import lease
from learner.swap.fence import Fence
from learner.swap.requests import SwapRequestWorker
from learner.threads import choose_threads
from learner.trackers import Reporter
from learner.traffic import yielding_to
from learner.trainer import Trainer, TrainerConfig
from store import db, schema
from store.control import KNOBS, Control
from store.tasks import TaskTable

log = logging.getLogger("onthejob.learner")

RETRY_CAP = 10.0  # seconds between tries at most, while the database or vLLM is away


class Learner(StartUp, Guarding, Grading, Stepping, Publishing, Weights, Tenants):
    """The orchestrator: set up, then look at the world until stopped (`iterate`). Its parts
    live beside it: startup, guarding, grading, step, publish, weights, tenants."""

    def __init__(self, config: LearnerConfig, ranks: Ranks | None = None) -> None:
        """`ranks`: this is rank 0 of several (torchrun), which train the model sharded
        (learner/distributed.py); everything else is this process's alone."""
        if ranks is not None and config.lora:
            raise ValueError("--lora trains on one device: launch it without torchrun")
        self.config = config
        self.ranks = ranks
        _set_threads(config, sharded=ranks is not None)
        if ranks is not None:
            log.info("training sharded over %d ranks (FSDP2) on %s", ranks.world, ranks.device)
        schema.require(config.database_url, migrate=config.migrate, who="learner")
        self.engine = db.make_engine(config.database_url)
        self.model_dir = Path(config.model)
        self.checkpoints = Path(config.checkpoints)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        # the self-judge's shadow verdicts come from a thread of their own (run), not from
        # grading: a step never waits on them
        self.grader: Any = grading.learner_grader(config, self.engine, shadow_inline=False)
        self.grouping = GroupingConfig(
            max_staleness=config.max_staleness, std_normalise=config.std_normalise
        )
        self.lora_settings = LoraSettings(
            rank=config.lora_rank, alpha=config.lora_alpha, targets=tuple(config.lora_targets)
        )
        self.trainer_config = _trainer_config(config)
        self.retry_policy = grading.RetryPolicy(
            base=config.grade_retry_base,
            cap=config.grade_retry_cap,
            max_attempts=config.grade_max_attempts,
        )
        self.signal_weights = SignalWeights.parse(config.signal_weights)
        if config.turn_credit:
            _say_turn_credit(config)
        self._init_state(config)

    def _init_state(self, config: LearnerConfig) -> None:
        """What the loop's parts keep between iterations, before the first."""
        self.tasks = TaskTable()
        self.hint_frame: HintFrame | str | None = None  # set at start (learner/hindsight.py)
        self.trainer: Trainer | None = None
        self.publisher: Publisher | None = None
        self.guard: Guard | None = None
        self.guard_config: GuardConfig | None = None
        self.serving: dict[str, Any] | None = None
        self.lineage: str | None = None
        self._lineages = {}
        self._said_no_tenants = False
        self._steered = {}
        self._swept_for = None
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
        self._pending: set[str] = set()
        self._pending_since = time.monotonic()
        # the last batch a step took, accounted (StepAccount.metrics): the heartbeat shows it
        self.last_batch: dict[str, Any] | None = None
        # a ready step waits for busy replicas to go idle (--yield-to-traffic)
        self.traffic = yielding_to(config.upstreams, config.yield_to_traffic)
        # and, first, for samples of the serving version itself (--fresh-wait)
        self.fresh = FreshWait(config.fresh_wait)
        # each step's metrics to TensorBoard, W&B, MLflow (--report-to; none by default)
        self.reporter = Reporter(
            config.report_to,
            config.report_dir,
            config.run_name or time.strftime("learn-%Y%m%d-%H%M%S"),
            config.model_dump(),
        )
        # the trainer holds exactly the serving checkpoint's weights and optimizer state (not
        # a step nobody recorded, nor a model half loaded): only then may a stop save it
        self._trainer_is_serving = False
        self._last_step_end = time.monotonic()  # the first step's time counts from here
        self._said_no_signal = False

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        self.start()
        self.heartbeat.start()
        # the admin API's rollbacks and promotes: the learner carries out every swap
        requests = SwapRequestWorker(
            self.engine, self.config.upstreams, drain_timeout=self.config.swap_drain_timeout
        ).start()
        shadow = None
        if shadow_judging.judges_in_shadow(self.grader):
            shadow = shadow_judging.ShadowJudging(self.engine, self.grader, lambda: self.tasks)
            shadow.start()
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
            if shadow is not None:
                shadow.stop()
            self.heartbeat.stop()
            self._save_optimizer_at_stop()
            self._save_lineages_at_stop()
            self.reporter.close()
            if self.publisher is not None:
                self.publisher.close()  # a transfer's weight files: a model's size in memory

    def iterate(self) -> None:
        """One look at the world: restore what serves if it needs it, follow the operator,
        grade, maybe train."""
        if self.ranks is not None:
            self.ranks.keepalive()
        if self._needs_restore or self._gates_left_closed():
            self._restore()
        if control.follow(self):  # operator pause and live knobs (admin API)
            self.traffic.reset()  # a pause is no wait for idle replicas
            self.fresh.reset()
            return
        self.activity = "grading"
        graded = self.grade_finished()
        trained = self.train_tenants() if self.config.tenants else self.maybe_train()
        if not graded and not trained:
            self.activity = "waiting for trajectories"
            self.stopping.wait(self.config.poll_interval)


def _set_threads(config: LearnerConfig, *, sharded: bool) -> None:
    """The trainer's threads: what --torch-threads says, or (0) what the cores on this host
    that its replicas leave free allow (learner/threads.py)."""
    threads = choose_threads(
        config.torch_threads,
        config.upstreams,
        cores=os.cpu_count() or 1,
        on_gpu=_trains_on_gpu(config.device),
        sharded=sharded,
    )
    if threads.threads:
        torch.set_num_threads(threads.threads)
    log.info("trainer threads: %s", threads.why)


def _trainer_config(config: LearnerConfig) -> TrainerConfig:
    return TrainerConfig(
        learning_rate=config.learning_rate,
        max_grad_norm=config.max_grad_norm,
        micro_batch_tokens=config.micro_batch_tokens,
        logprob_chunk_tokens=config.logprob_chunk_tokens,
        activation_checkpointing=config.activation_checkpointing,
        truncated=config.truncated,
        max_sequence_mismatch=config.max_sequence_mismatch,
        loss=LossConfig(
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            max_importance_weight=config.max_importance_weight,
            kl_coef=config.kl_coef,
            clip_against=config.clip_against,
        ),
    )


def _say_turn_credit(config: LearnerConfig) -> None:
    log.info("per-turn credit: each reply trains on its own next-turn signal")
    if not any(g.startswith("next_turn") for g in config.graders):
        log.warning(
            "--credit turn trains replies on the next-turn signals in their grades: "
            "only trajectories graded by next_turn (here: rollout runs whose runner "
            "used it) have them; the others train nothing"
        )


def _trains_on_gpu(device: str | None) -> bool:
    """Whether the trainer computes on a GPU (--device, else cuda when there is one)."""
    if device is not None:
        return not device.startswith("cpu")
    return torch.cuda.is_available()


def _unreachable(exc: DBAPIError) -> bool:
    """The database is away (refused, dropped, restarting), as opposed to refusing a query."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
