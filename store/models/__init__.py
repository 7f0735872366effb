"""Tables shared by the proxy and the learner.

Invariant: the schema is created and changed only by Alembic revisions in `migrations/`;
these classes describe it for queries and must match the newest revision.

The tables are split by owner: recording (the proxy), learning (the learner), swaps (the
control plane), canaries (a new version beside the serving one) and rollouts (the rollout
runner). Importing this package registers them all on `Base.metadata`.
"""

from store.models.base import Base
from store.models.canaries import Canary, CanaryAction, WatchAlert
from store.models.learning import (
    Feedback,
    Grade,
    LearnerState,
    Task,
    TrainingStep,
    TurnSignal,
)
from store.models.recording import Call, ClientKey, ProxyInstance, StoredResponse, Trajectory
from store.models.rollouts import (
    Curriculum,
    CurriculumEval,
    CurriculumPromotion,
    EvalResult,
    RolloutRun,
)
from store.models.swaps import PolicyVersion, PublishLease, SwapGate, SwapRequest, Tenant

__all__ = [
    "Base",
    "Call",
    "Canary",
    "CanaryAction",
    "ClientKey",
    "Curriculum",
    "CurriculumEval",
    "CurriculumPromotion",
    "EvalResult",
    "Feedback",
    "Grade",
    "LearnerState",
    "PolicyVersion",
    "ProxyInstance",
    "PublishLease",
    "RolloutRun",
    "StoredResponse",
    "SwapGate",
    "SwapRequest",
    "Task",
    "Tenant",
    "TrainingStep",
    "Trajectory",
    "TurnSignal",
    "WatchAlert",
]
