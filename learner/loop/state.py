"""What the learner's parts share: the loop's state (`LoopState`), a policy lineage's own
state (`Lineage`), and the constants more than one part needs.

The parts (learner/loop/*.py) are objects that each hold the one `LoopState` and the parts
they call; none inherits from another. `LoopState.lineage` is the lineage the parts work on
now: the shared policy's (`LoopState.shared`), or a tenant's for its turn (`learn --tenants`,
learner/loop/tenants.py), so a tenant's step runs exactly the code of a step of the shared
policy, on its own trainer, publisher and versions."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Engine

from learner import grading
from learner.accounting import LastBatch
from learner.config import LearnerConfig
from learner.control import Knobs
from learner.distributed import Ranks
from learner.fresh_wait import FreshWait
from learner.grouping import Baselines, GroupingConfig
from learner.guard import GuardConfig
from learner.guard_run import Guard
from learner.hindsight import HintFrame
from learner.lora import LoraSettings
from learner.loss import LossConfig
from learner.signals import SignalWeights
from learner.stopping import GracefulStop
from learner.swap import lease
from learner.swap.adapter_memory import AdapterMemory
from learner.swap.fence import Fence
from learner.swap.publisher import Probe, WeightPublisher
from learner.time_slice import TimeSlice
from learner.trackers import Reporter
from learner.traffic import TrafficYield, yielding_to
from learner.trainer import Trainer, TrainerConfig
from store import learner_state
from store.control import KNOBS, Control
from store.policy_versions import PolicyVersionRow
from store.tasks import TaskTable

PROBE_TEXT = "The quick brown fox jumps over the lazy dog."
LEASE_WAIT = 300.0  # seconds the learner waits for an operator's rollback to finish
LEARNER = "learner@"  # holder prefix: one learner per database, a restart takes over


class RestoreFailed(RuntimeError):
    """The replicas could not be made to serve what the store says serves (yet)."""


@dataclass
class Lineage:
    """A policy's own state: the shared policy's, or one tenant's (`tenant`)."""

    tenant: str | None
    serving: PolicyVersionRow | None  # the version that serves it, as recorded
    baselines: Baselines
    fresh: FreshWait  # a ready step waits for the serving version's samples (--fresh-wait)
    traffic: TrafficYield  # and for busy replicas to go idle (--yield-to-traffic)
    trainer: Trainer | None = None
    publisher: WeightPublisher | None = None
    guard: Guard | None = None
    # the trainer holds exactly the serving checkpoint's weights and optimizer state (not a
    # step nobody recorded, nor a model half loaded): only then may a stop save it
    trainer_is_serving: bool = False
    needs_restore: bool = False  # the replicas may not serve what the store says
    # the canary the learner started for the lineage's newest version: until it is decided
    # the trainer holds that candidate, not what serves (learner/loop/step.py follows)
    canary: int | None = None

    @classmethod
    def fresh_for(
        cls, config: LearnerConfig, tenant: str | None, serving: PolicyVersionRow | None = None
    ) -> Lineage:
        return cls(
            tenant=tenant,
            serving=serving,
            baselines=Baselines.fresh(config.type_baseline),
            fresh=FreshWait(config.fresh_wait),
            traffic=yielding_to(config.upstreams, config.yield_to_traffic),
        )


class LoopState:
    """The learner's state between iterations, shared by its parts; set up before the first
    (`start` fills in what the replicas tell: probe, tolerance, transport, what serves)."""

    def __init__(
        self, config: LearnerConfig, ranks: Ranks | None, engine: Engine, grader: Any
    ) -> None:
        self.config = config
        self.ranks = ranks  # rank 0 of several (torchrun) that train sharded, or None
        self.engine = engine
        self.grader = grader
        self.model_dir = Path(config.model)
        self.checkpoints = Path(config.checkpoints)
        self.grouping = GroupingConfig(
            max_staleness=config.max_staleness, std_normalise=config.std_normalise
        )
        self.lora_settings = LoraSettings(
            rank=config.lora_rank, alpha=config.lora_alpha, targets=tuple(config.lora_targets)
        )
        self.trainer_config = trainer_config(config)
        self.retry_policy = grading.RetryPolicy(
            base=config.grade_retry_base,
            cap=config.grade_retry_cap,
            max_attempts=config.grade_max_attempts,
        )
        self.signal_weights = SignalWeights.parse(config.signal_weights)
        self.tasks = TaskTable()
        self.tasks_revision: Any = None  # the store's task table revision last loaded
        self.shared = Lineage.fresh_for(config, None)
        self.time_slice = TimeSlice([], 0)  # the learner's choice (learner/time_slice.py)
        self.lineage = self.shared  # whose lineage the parts work on now
        self.guard_config: GuardConfig | None = None  # --tenants: each tenant's guard's
        self.step = 0
        self.holder = lease.holder_name(LEARNER.rstrip("@"))
        self.fence = Fence(engine, self.holder, drain_timeout=config.swap_drain_timeout)
        # the knobs as the command line (and config, environment) set them; the operator's
        # live values override them (learner/control.py)
        self.own_knobs = cast(Knobs, {name: getattr(config, name) for name in KNOBS})
        self.own_set_at: dict[str, str] = {}
        self.applied_control = Control()  # what operators asked, as last applied
        self.activity = "starting"  # what the heartbeat says the learner is doing
        # a stop (signal, or `stopping.request()` from another thread) never cuts a swap short
        self.stopping = GracefulStop()
        # each step's metrics to TensorBoard, W&B, MLflow (--report-to; none by default)
        self.reporter = Reporter(
            config.report_to,
            config.report_dir,
            config.run_name or time.strftime("learn-%Y%m%d-%H%M%S"),
            config.model_dump(),
        )
        # the last batch a step took, accounted (StepAccount.metrics): the heartbeat shows it
        self.last_batch: LastBatch | None = None
        # what the replicas tell, at start (learner/loop/startup.py)
        self.probe = Probe(prompt_token_ids=[])
        self.hint_frame: HintFrame | str | None = None  # hindsight's; str: why none
        self.tolerance = 0.0
        self.weights_checked = False
        self.transport = "disk"  # how full weights reach the replicas: disk or transfer
        # the adapters' memory copies vLLM loads (--lora-load-from); None: from the disk
        self.adapter_memory: AdapterMemory | None = None
        self.last_step_end = time.monotonic()  # the first step's time counts from here
        self.said_no_signal = False  # said why no step is ready (learner/cannot_learn.py)

    @property
    def tenant(self) -> str | None:
        """The tenant whose lineage the parts work on now; None: the shared policy's."""
        return self.lineage.tenant


def trainer_config(config: LearnerConfig) -> TrainerConfig:
    return TrainerConfig(
        learning_rate=config.learning_rate,
        max_grad_norm=config.max_grad_norm,
        micro_batch_tokens=config.micro_batch_tokens,
        logprob_chunk_tokens=config.logprob_chunk_tokens,
        activation_checkpointing=config.activation_checkpointing,
        truncated=config.truncated,
        max_sequence_mismatch=config.max_sequence_mismatch,
        step_kl=config.step_kl,
        loss=LossConfig(
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            max_importance_weight=config.max_importance_weight,
            kl_coef=config.kl_coef,
            clip_against=config.clip_against,
        ),
    )


def baseline_key(key: str, tenant: str | None) -> str:
    """Where a lineage's running baselines are kept (learner_state)."""
    return key if tenant is None else f"{key}@tenant:{tenant}"


def save_baselines(conn: Any, baselines: Baselines, tenant: str | None = None) -> None:
    for key, state in baselines.states().items():
        learner_state.set_state(conn, baseline_key(key, tenant), state)
