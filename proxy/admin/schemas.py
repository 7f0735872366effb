"""Input models of the admin API: every field bounded, every string storable.

Strings must be valid UTF-8 without NUL (PostgreSQL refuses both; a refusal there would
otherwise surface as a server error), timestamps are made UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from store.tenants import CanaryOverrides


def _storable(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid UTF-8 text") from exc
    return value


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("is out of range") from exc


Text = Annotated[str, AfterValidator(_storable)]
Key = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_storable)]
TaskKeyText = Annotated[str, Field(min_length=1, max_length=500), AfterValidator(_storable)]
Time = Annotated[datetime | None, AfterValidator(_utc)]
Reward = Annotated[float, Field(allow_inf_nan=False, ge=-1e9, le=1e9)]


class TrajectoryFilter(BaseModel):
    """Which trajectories: every given condition must hold."""

    model_config = ConfigDict(extra="forbid")

    session: Key | None = Field(None, description="session key")
    task_key: TaskKeyText | None = None
    type: Key | None = Field(None, description="interaction type (X-Onthejob-Type or auto:...)")
    status: Literal["open", "finished"] | None = None
    policy_version: Key | None = Field(None, description="a call was served by this version")
    min_reward: Reward | None = None
    max_reward: Reward | None = None
    graded: bool | None = Field(None, description="has a reward (true) or not yet (false)")
    grading: Literal["failed", "retrying"] | None = Field(
        None,
        description="its grading failed: for good (failed) or to be tried again (retrying)",
    )
    since: Time = Field(None, description="started at or after (ISO 8601; naive = UTC)")
    until: Time = Field(None, description="started before (ISO 8601; naive = UTC)")
    q: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_storable)] | None = (
        Field(None, description="text in a request (messages, prompt, input), case-insensitive")
    )

    @model_validator(mode="after")
    def _ranges(self) -> TrajectoryFilter:
        if (
            self.min_reward is not None
            and self.max_reward is not None
            and self.min_reward > self.max_reward
        ):
            raise ValueError("min_reward is greater than max_reward")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self


class TrajectoryPage(TrajectoryFilter):
    limit: int = Field(50, ge=1, le=500)
    cursor: Annotated[str, Field(max_length=500)] | None = Field(
        None, description="next_cursor of the previous page"
    )


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trajectory_id: Key | None = None
    session: Key | None = None
    reward: Reward
    comment: Annotated[str, Field(max_length=10_000), AfterValidator(_storable)] | None = None

    @model_validator(mode="after")
    def _target(self) -> FeedbackIn:
        if (self.trajectory_id is None) == (self.session is None):
            raise ValueError("give exactly one of trajectory_id or session")
        return self


class TasksIn(BaseModel):
    """Tasks in the task-file format (docs/rollouts.md), as objects or as JSON Lines text."""

    model_config = ConfigDict(extra="forbid")

    tasks: Annotated[list[dict[str, Any]], Field(max_length=10_000)] | None = None
    jsonl: Annotated[str, Field(max_length=20_000_000), AfterValidator(_storable)] | None = None

    @model_validator(mode="after")
    def _one(self) -> TasksIn:
        if (self.tasks is None) == (self.jsonl is None):
            raise ValueError("give exactly one of tasks (a list of objects) or jsonl (text)")
        return self


class KnobsIn(BaseModel):
    """Live knobs; a field set to null returns to what the process was started with."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    batch_trajectories: Annotated[int, Field(ge=1, le=100_000)] | None = None
    max_batch_trajectories: Annotated[int, Field(ge=0, le=100_000)] | None = Field(
        None, description="at most this many trajectories with a signal a step; 0: no bound"
    )
    max_staleness: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    fresh_wait: Annotated[float, Field(ge=0, le=86_400, allow_inf_nan=False)] | None = Field(
        None,
        description="seconds a ready step first waits for trajectories of the serving version "
        "itself (learn --fresh-wait); 0: train at once",
    )
    fanout: Annotated[int, Field(ge=1, le=64)] | None = Field(
        None, description="group size of fan-out (this proxy process, applied at once)"
    )


class StatsQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: Time = Field(
        None, description="default: 24 hours (hour buckets) or 30 days (day buckets) before until"
    )
    until: Time = Field(None, description="default: now")
    bucket: Literal["hour", "day"] = "hour"


class CurvesQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: Time = Field(None, description="trajectories that ended at or after (default: all)")
    until: Time = Field(None, description="trajectories that ended before (default: all)")
    buckets: int = Field(
        30, ge=2, le=500, description="at most this many time buckets (their size is round)"
    )
    success_at: Reward = Field(
        1.0, description="a graded trajectory succeeded if its reward is at least this"
    )

    @model_validator(mode="after")
    def _window(self) -> CurvesQuery:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self


class TypesQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Key | None = Field(None, description="only this interaction type")
    since: Time = Field(None, description="trajectories started at or after (default: all)")
    until: Time = Field(None, description="trajectories started before (default: all)")
    success_at: Reward = Field(
        1.0, description="a graded trajectory succeeded if its reward is at least this"
    )

    @model_validator(mode="after")
    def _window(self) -> TypesQuery:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("since must be before until")
        return self


class CompatQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: Time = Field(None, description="default: 24 hours before until")
    until: Time = Field(None, description="default: now")


KeyName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="letters, digits, '.', '_' and '-' (what calls record, and what "
        "`onthejob learn --keys` names)",
    ),
]


class ClientKeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: KeyName


TypeName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9._:/@+=-]+$",
        description="an interaction type: an X-Onthejob-Type value, or a fingerprint "
        "(`auto:...`) as GET /admin/api/types lists them",
    ),
]


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


class TenantIn(BaseModel):
    """What makes a call the tenant's: its client key, else its interaction type."""

    model_config = ConfigDict(extra="forbid")

    client_keys: Annotated[list[KeyName], AfterValidator(_unique)] = Field(
        default_factory=list, max_length=1000, description="names of client keys"
    )
    interaction_types: Annotated[list[TypeName], AfterValidator(_unique)] = Field(
        default_factory=list, max_length=1000
    )

    @model_validator(mode="after")
    def _lists_something(self) -> TenantIn:
        if not self.client_keys and not self.interaction_types:
            raise ValueError("a tenant lists at least one client key or interaction type")
        return self


class WatchThresholdsIn(BaseModel):
    """The reward-hacking watch's thresholds on a tenant's canaries, by the names of
    learner/canary/watch.py's `Thresholds`; each left out is the code's."""

    model_config = ConfigDict(extra="forbid")

    min_trajectories: int | None = Field(
        None, ge=1, le=10**6, description="trajectories in each arm before any detector speaks"
    )
    reward_rise: float | None = Field(
        None,
        allow_inf_nan=False,
        ge=0.0,
        le=1e6,
        description="'reward up': the mean reward rose by at least this",
    )
    share_rise: float | None = Field(
        None,
        allow_inf_nan=False,
        ge=0.0,
        le=1.0,
        description="a share 'grows': by at least this (0.05: 5 points)",
    )
    share_ratio: float | None = Field(
        None,
        allow_inf_nan=False,
        ge=1.0,
        le=1e6,
        description="and to at least this many times the share before",
    )
    share_floor: float | None = Field(
        None,
        allow_inf_nan=False,
        ge=0.0,
        le=1.0,
        description="the share before, for the ratio, is at least this",
    )
    length_low: float | None = Field(
        None,
        allow_inf_nan=False,
        gt=0.0,
        le=1.0,
        description="median reply length after / before below this: collapsing",
    )
    length_high: float | None = Field(
        None, allow_inf_nan=False, ge=1.0, le=1e6, description="above this: exploding"
    )


class TenantCanaryIn(BaseModel):
    """A tenant's own settings for the canaries the learner starts of its versions, and the
    watch on any canary of its calls, each over the learner's (`learn --canary-*`); each
    left out is the learner's, so {} clears them."""

    model_config = ConfigDict(extra="forbid")

    share: float | None = Field(
        None,
        allow_inf_nan=False,
        ge=0.0,
        lt=1.0,
        description="of the tenant's sessions each new version serves first; 0: no canary, "
        "its versions serve all of them at once",
    )
    min_calls: int | None = Field(None, ge=1, le=10**9, description="per arm, before any decision")
    time_limit_s: float | None = Field(None, allow_inf_nan=False, gt=0.0, le=365 * 24 * 3600.0)
    default_decision: Literal["promote", "rollback"] | None = Field(
        None, description="taken at the time limit if nothing decided before"
    )
    watch: WatchThresholdsIn | None = None

    def overrides(self) -> CanaryOverrides:
        """As the store keeps them: only what is set."""
        found = self.model_dump(exclude_none=True)
        if not found.get("watch"):
            found.pop("watch", None)
        return cast(CanaryOverrides, found)


class TenantServingIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Key | None = Field(
        description="the LoRA adapter (a policy version's name) the tenant's calls go to; "
        "null: the shared policy"
    )
