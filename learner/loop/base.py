"""What the parts of the learner share: the state every part reads and writes (declared
here, set up by `Learner.__init__`), and the constants more than one part needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from tqdm import tqdm

from learner import grading
from learner.config import LearnerConfig
from learner.distributed import Ranks
from learner.fresh_wait import FreshWait
from learner.grouping import Baselines, GroupingConfig
from learner.guard import GuardConfig
from learner.guard_run import Guard
from learner.hindsight import HintFrame
from learner.lora import LoraSettings
from learner.signals import SignalWeights
from learner.stopping import GracefulStop
from learner.swap.fence import Fence
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.lora_publisher import LoraPublisher
from learner.swap.publisher import Probe
from learner.trackers import Reporter
from learner.traffic import TrafficYield
from learner.trainer import Trainer, TrainerConfig
from store import learner_state
from store.control import Control
from store.tasks import TaskTable

PROBE_TEXT = "The quick brown fox jumps over the lazy dog."
LEASE_WAIT = 300.0  # seconds the learner waits for an operator's rollback to finish
LEARNER = "learner@"  # holder prefix: one learner per database, a restart takes over

# the two ways a version reaches the replicas: whole weights, or an adapter on top of them
Publisher = FullWeightPublisher | LoraPublisher


class RestoreFailed(RuntimeError):
    """The replicas could not be made to serve what the store says serves (yet)."""


class LearnerBase:
    """The learner's state, shared by its parts (learner/loop/*.py)."""

    config: LearnerConfig
    ranks: Ranks | None
    engine: Engine
    model_dir: Path
    checkpoints: Path
    grader: Any
    grouping: GroupingConfig
    lora_settings: LoraSettings
    trainer_config: TrainerConfig
    retry_policy: grading.RetryPolicy
    signal_weights: SignalWeights
    tasks: TaskTable
    trainer: Trainer | None
    publisher: Publisher | None
    guard: Guard | None
    guard_config: GuardConfig | None  # --tenants: each tenant's guard is made from it
    serving: dict[str, Any] | None
    # whose lineage the fields above hold now: a tenant's (learn --tenants), or None: the
    # shared policy's (learner/loop/tenants.py)
    lineage: str | None
    baselines: Baselines
    step: int
    holder: str
    fence: Fence
    own_knobs: dict[str, Any]
    own_set_at: dict[str, str]
    applied_control: Control
    activity: str
    stopping: GracefulStop
    traffic: TrafficYield
    fresh: FreshWait
    reporter: Reporter
    last_batch: dict[str, Any] | None
    probe: Probe
    hint_frame: HintFrame | str | None  # hindsight's (learner/hindsight.py); str: why none
    tolerance: float
    weights_checked: bool
    transport: str  # how full weights reach the replicas: disk or transfer
    _needs_restore: bool
    _grading: tqdm | None
    _pending: set[str]
    _pending_since: float
    _trainer_is_serving: bool
    _last_step_end: float  # monotonic: when the last step (or the learner's start) ended
    _said_no_signal: bool  # the learner said why no step is ready (learner/cannot_learn.py)


def baseline_key(key: str, tenant: str | None) -> str:
    """Where a lineage's running baselines are kept (learner_state)."""
    return key if tenant is None else f"{key}@tenant:{tenant}"


def save_baselines(conn: Any, baselines: Baselines, tenant: str | None = None) -> None:
    for key, state in baselines.states().items():
        learner_state.set_state(conn, baseline_key(key, tenant), state)
