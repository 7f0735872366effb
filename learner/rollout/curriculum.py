"""Curricula: ordered stages of task sets, each with a promotion rule and a replay share.

A curriculum file is TOML (read with the standard library's tomllib)::

    name = "arithmetic-then-tools"   # optional; default: the file's stem
    tasks_per_round = 4              # tasks drawn for a training round (default 4)
    eval_every = 2                   # training rounds between evals of a stage (default 2)
    eval_samples = 4                 # runs per eval task: k of pass@k (default 4)
    seed = 0                         # which tasks the rounds draw (default 0)

    [[stages]]
    name = "qa"
    tasks = "qa-train.jsonl"         # training task set (rollout task format), relative to
    eval = "qa-eval.jsonl"           # this file; the eval split, also a task set
    promote = { metric = "pass_at_1", at_least = 0.7, over_last = 2 }
    command = ["python", "qa_agent.py", "{prompt}"]   # optional: else the one after `--`

    [[stages]]
    name = "tools"
    tasks = "tools-train.jsonl"
    eval = "tools-eval.jsonl"
    promote = { at_least = 0.5 }
    replay = 0.25                    # share of a round's tasks drawn from earlier stages

A stage may also set `tasks_per_round`, `eval_every` and `eval_samples` for itself.

The promotion rule holds when the stage has had at least `over_last` evals since it became
the current stage and the mean of `metric` (`pass_at_1`, `mean_reward` or `pass_at_k`) over
the last `over_last` of them is at least `at_least`. Every eval of a stage has the same
size, so that mean is also the metric over their pooled runs (for pass@1 and mean reward).

Invariant: a `Curriculum` that loaded is valid; every mistake raises `CurriculumError`
naming the file, the stage and the field. Task ids are one namespace across the whole
curriculum (the task table is keyed by id): an id may appear in several of its task sets
only if it is the same task there.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learner.rollout.taskset import TaskSet, load_task_set
from store.curricula import CurriculumError, RuleState, StageState
from store.json_types import JsonObject
from store.tasks import TaskTable, TaskTableError

METRICS = ("pass_at_1", "mean_reward", "pass_at_k")
MAX_NAME = 80  # curriculum and stage names: task set names hold both (at most 200)
_TOP_FIELDS = {"name", "tasks_per_round", "eval_every", "eval_samples", "seed", "stages"}
_STAGE_FIELDS = {
    "name",
    "tasks",
    "eval",
    "promote",
    "replay",
    "command",
    "tasks_per_round",
    "eval_every",
    "eval_samples",
}
_RULE_FIELDS = {"metric", "at_least", "over_last"}
_ROUND_DEFAULTS = {"tasks_per_round": 4, "eval_every": 2, "eval_samples": 4}


@dataclass(frozen=True)
class EvalPoint:
    """One eval of a stage's split: the metrics the promotion rule reads."""

    metrics: Mapping[str, float | None]  # pass_at_1, mean_reward, pass_at_k (None: no runs)


@dataclass(frozen=True)
class Verdict:
    holds: bool
    value: float | None  # the metric's mean over the window (None: not enough evals)
    evals: int  # how many evals the window had


@dataclass(frozen=True)
class PromotionRule:
    at_least: float
    metric: str = "pass_at_1"
    over_last: int = 1

    def check(self, evals: Sequence[EvalPoint]) -> Verdict:
        """Whether the last `over_last` evals (oldest first in `evals`) pass the rule."""
        window = list(evals)[-self.over_last :]
        values = [e.metrics.get(self.metric) for e in window]
        if len(window) < self.over_last or any(v is None for v in values):
            # an eval with no graded run says nothing: it cannot count towards a promotion
            mean = None if not values or any(v is None for v in values) else _mean(values)
            return Verdict(False, mean, len(window))
        mean = _mean(values)
        # a share computed from counts (e.g. 7/10) can sit a rounding error below its
        # threshold written in decimal (0.7)
        return Verdict(mean >= self.at_least - 1e-9, mean, len(window))

    def describe(self) -> str:
        over = "the last eval" if self.over_last == 1 else f"the last {self.over_last} evals"
        return f"{_METRIC_LABELS[self.metric]} >= {self.at_least:g} over {over}"

    def state(self) -> RuleState:
        return {"metric": self.metric, "at_least": self.at_least, "over_last": self.over_last}


_METRIC_LABELS = {"pass_at_1": "pass@1", "mean_reward": "mean reward", "pass_at_k": "pass@k"}


def metric_label(metric: str) -> str:
    return _METRIC_LABELS[metric]


def _mean(values: Sequence[float | None]) -> float:
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present)


@dataclass(frozen=True)
class Stage:
    name: str
    index: int  # 0-based place in the curriculum
    tasks: TaskSet  # training tasks
    eval: TaskSet  # the eval split
    rule: PromotionRule
    replay: float  # share of a round's tasks drawn from earlier stages' training tasks
    command: list[str] | None  # None: the command given on the command line
    tasks_per_round: int
    eval_every: int
    eval_samples: int

    def replay_count(self) -> int:
        """Replay tasks in one round: at least one when the share is above zero."""
        if self.replay <= 0:
            return 0
        return min(self.tasks_per_round - 1, max(1, round(self.replay * self.tasks_per_round)))


@dataclass(frozen=True)
class Curriculum:
    name: str
    path: Path
    stages: list[Stage]
    seed: int = 0
    _by_name: dict[str, Stage] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({s.name: s for s in self.stages})

    def stage(self, name: str) -> Stage | None:
        return self._by_name.get(name)

    def earlier_tasks(self, stage: Stage) -> TaskTable:
        """The training tasks of every stage before `stage`: what its rounds replay."""
        tasks = {}
        for earlier in self.stages[: stage.index]:
            tasks.update(earlier.tasks.tasks)
        return TaskTable(tasks)

    def state(self) -> list[StageState]:
        """What the store keeps of the stages (the admin API shows it)."""
        return [
            {
                "name": s.name,
                "rule": s.rule.state(),
                "replay": s.replay,
                "train_tasks": len(s.tasks.tasks),
                "eval_tasks": len(s.eval.tasks),
            }
            for s in self.stages
        ]


def load_curriculum(path: str | Path) -> Curriculum:
    """A validated curriculum; CurriculumError (file, stage, field) for a bad one."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CurriculumError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:
        raise CurriculumError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise CurriculumError(f"{path}: not valid TOML: {exc}") from None
    _unknown(raw, _TOP_FIELDS, str(path))
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise CurriculumError(f"{path}: field 'name': must be 1-{MAX_NAME} characters")
    if ":" in name:  # task set names are curriculum:<name>:<stage>:...
        raise CurriculumError(f"{path}: field 'name': must not contain ':'")
    defaults = {key: _count(raw, key, str(path), value) for key, value in _ROUND_DEFAULTS.items()}
    seed = raw.get("seed", 0)
    if type(seed) is not int:
        raise CurriculumError(f"{path}: field 'seed': expected an integer")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise CurriculumError(f"{path}: field 'stages': expected at least one [[stages]] table")
    stages: list[Stage] = []
    for index, entry in enumerate(stages_raw):
        stages.append(_stage(path, name, index, entry, defaults, [s.name for s in stages]))
    _check_task_ids(path, stages)
    return Curriculum(name=name, path=path, stages=stages, seed=seed)


def _where(path: Path, index: int, name: str | None) -> str:
    return f"{path}: stage {index + 1}" + (f" ({name!r})" if name else "")


def _stage(
    path: Path,
    curriculum: str,
    index: int,
    entry: Any,
    defaults: dict[str, int],
    earlier: list[str],
) -> Stage:
    if not isinstance(entry, dict):
        raise CurriculumError(f"{_where(path, index, None)}: expected a [[stages]] table")
    name = entry.get("name")
    where = _where(path, index, name if isinstance(name, str) else None)
    _unknown(entry, _STAGE_FIELDS, where)
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or ":" in name:
        raise CurriculumError(
            f"{where}: field 'name': expected 1-{MAX_NAME} characters without ':'"
        )
    if name in earlier:
        raise CurriculumError(f"{where}: field 'name': a stage {name!r} comes earlier")
    task_sets = {}
    for key in ("tasks", "eval"):
        given = entry.get(key)
        if not isinstance(given, str) or not given.strip():
            raise CurriculumError(f"{where}: field {key!r}: expected the path of a task set")
        file = Path(given) if Path(given).is_absolute() else path.parent / given
        try:
            # rollouts file their runs (and evals their results) under this name
            label = "train" if key == "tasks" else "eval"
            task_sets[key] = load_task_set(file, name=f"curriculum:{curriculum}:{name}:{label}")
        except TaskTableError as exc:
            raise CurriculumError(f"{where}: field {key!r}: {exc}") from None
    replay = entry.get("replay", 0.0)
    if type(replay) not in (int, float) or not 0 <= replay < 1 or math.isnan(replay):
        raise CurriculumError(f"{where}: field 'replay': expected a share from 0 up to below 1")
    if replay and index == 0:
        raise CurriculumError(f"{where}: field 'replay': the first stage has nothing to replay")
    counts = {key: _count(entry, key, where, defaults[key]) for key in _ROUND_DEFAULTS}
    if replay and counts["tasks_per_round"] < 2:
        raise CurriculumError(
            f"{where}: field 'replay': needs tasks_per_round of at least 2 (one task of the "
            "stage and one replayed)"
        )
    return Stage(
        name=name,
        index=index,
        tasks=task_sets["tasks"],
        eval=task_sets["eval"],
        rule=_rule(entry.get("promote"), where),
        replay=float(replay),
        command=_command(entry.get("command"), where),
        **counts,
    )


def _rule(raw: Any, where: str) -> PromotionRule:
    if not isinstance(raw, dict):
        raise CurriculumError(
            f"{where}: field 'promote': expected a table such as "
            '{ metric = "pass_at_1", at_least = 0.7, over_last = 2 }'
        )
    _unknown(raw, _RULE_FIELDS, where, prefix="promote.")
    metric = raw.get("metric", "pass_at_1")
    if metric not in METRICS:
        raise CurriculumError(
            f"{where}: field 'promote.metric': expected one of {', '.join(METRICS)}, got {metric!r}"
        )
    at_least = raw.get("at_least")
    if type(at_least) not in (int, float) or math.isnan(at_least):
        raise CurriculumError(f"{where}: field 'promote.at_least': expected a number")
    if metric != "mean_reward" and not 0 <= at_least <= 1:
        raise CurriculumError(f"{where}: field 'promote.at_least': {metric} is a share, 0 to 1")
    over_last = raw.get("over_last", 1)
    if type(over_last) is not int or not 1 <= over_last <= 100:
        raise CurriculumError(f"{where}: field 'promote.over_last': expected an integer 1-100")
    return PromotionRule(at_least=float(at_least), metric=metric, over_last=over_last)


def _command(raw: Any, where: str) -> list[str] | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(part, str) for part in raw)
        or not raw[0].strip()
    ):
        raise CurriculumError(
            f"{where}: field 'command': expected a list of strings, such as "
            '["python", "agent.py", "{prompt}"]'
        )
    return list(raw)


def _count(table: JsonObject, key: str, where: str, default: int) -> int:
    value = table.get(key, default)
    if type(value) is not int or not 1 <= value <= 10_000:
        raise CurriculumError(f"{where}: field {key!r}: expected an integer 1-10000")
    return value


def _unknown(table: JsonObject, known: set[str], where: str, prefix: str = "") -> None:
    for key in table:
        if key not in known:
            raise CurriculumError(
                f"{where}: field {prefix + key!r}: unknown (known: {', '.join(sorted(known))})"
            )


def _check_task_ids(path: Path, stages: list[Stage]) -> None:
    seen: dict[str, tuple[Any, str]] = {}
    for stage in stages:
        for key in ("tasks", "eval"):
            task_set: TaskSet = getattr(stage, key)
            for task in task_set.tasks.values():
                where = f"stage {stage.index + 1} ({stage.name!r}) {key}"
                earlier = seen.setdefault(task.key, (task, where))
                if earlier[0] != task:
                    raise CurriculumError(
                        f"{_where(path, stage.index, stage.name)}: field {key!r}: task id "
                        f"{task.key!r} is a different task in {earlier[1]} (task ids are one "
                        "namespace across a curriculum)"
                    )
