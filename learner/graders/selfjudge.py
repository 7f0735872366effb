"""Self-evaluation by default: the served model judges the trajectories no other grader
applies to, and, on a sample of those that have a ground truth, is judged against it.

Per trajectory, the first that applies:
1. the learner's own judge traffic (type `onthejob-judge`): never graded, never trained on;
2. the configured graders (`--grader`), when they can grade it: any grader but `reference`
   grades everything, `reference` only trajectories whose task has a reference answer;
3. feedback people already posted for it;
4. the self-judge: the `judge` grader against the served model, with its type's rubric
   (learner/graders/rubrics.py), unless self-judging is off (`--no-self-judge`) or off for
   that type; then the configured graders, as without this.

The agreement figures: a trajectory graded by 2 or 3 is, with probability `share` and at most
`per_minute` a minute, judged by the self-judge as well. The verdict is kept in the grade's
detail under "self_judge" with the ground truth next to it ("truth": source and reward); it
never changes the reward. The admin API's /self-judge reads them (proxy/admin/selfjudge.py).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from learner.graders.base import Grade, Grader
from learner.graders.combine import CombinedGrader
from learner.graders.feedback import FeedbackGrader
from learner.graders.judge import JUDGE_TYPE
from learner.graders.rubrics import Rubric, Rubrics
from learner.graders.self_judge_entry import (
    SELF_JUDGE,
    SelfJudgeEntry,
    as_grade,
    entry_of,
    shadow_entry,
)
from learner.signals import SignalWeights
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

# graders whose reward is a ground truth the self-judge can be measured against
TRUTH_KINDS = frozenset({"reference", "python", "command", "feedback"})

JudgeFactory = Callable[[str], Grader]  # rubric text -> a judge


def configured_applies(kinds: frozenset[str], trajectory: Trajectory, tasks: TaskTable) -> bool:
    """Whether the configured graders can grade it: every component must (combine.py)."""
    if "reference" not in kinds:
        return True
    key = trajectory.task_key
    task = tasks.get(key) if key is not None else None
    return task is not None and task.answer is not None


@dataclass(frozen=True)
class ShadowPolicy:
    share: float = 0.1  # of the trajectories with a ground truth, also self-judged
    per_minute: float = 20.0  # at most this many of those judgements a minute (and a burst)
    # after a judge that was away or overloaded, no shadow judgements for this long: they
    # would only slow grading down
    pause_after_failure: float = 300.0
    # at most this share of the wall time since the sampler started goes to shadow judging
    # (after a first `time_allowance` seconds): the judge is the served model, which may be
    # slow, and grading waits for these calls, so a count a minute alone does not bound them
    time_share: float = 0.1
    time_allowance: float = 30.0


class ShadowSampler:
    """Which ground-truth trajectories the self-judge also judges: a fixed share by the hash
    of the id (a regrade samples the same ones), within a token bucket of `per_minute`."""

    def __init__(self, policy: ShadowPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self.tokens = policy.per_minute
        self.at = clock()
        self.started = self.at
        self.spent = 0.0  # seconds of shadow judging so far
        self.paused_until = -math.inf

    def pause(self) -> None:
        self.paused_until = self.clock() + self.policy.pause_after_failure

    def spend(self, seconds: float) -> None:
        """Shadow judging took this long (counted against `time_share`)."""
        self.spent += max(0.0, seconds)

    def over_time_budget(self) -> bool:
        budget = self.policy.time_allowance + self.policy.time_share * (self.clock() - self.started)
        return self.spent >= budget

    def take(self, trajectory_id: str) -> bool:
        if self.policy.share <= 0 or self.policy.per_minute <= 0:
            return False
        if self.clock() < self.paused_until or self.over_time_budget():
            return False
        if shadow_share_of(trajectory_id) >= self.policy.share:
            return False
        now = self.clock()
        self.tokens = min(
            self.policy.per_minute, self.tokens + (now - self.at) * self.policy.per_minute / 60
        )
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def shadow_share_of(trajectory_id: str) -> float:
    """Where the id falls in [0, 1): the shadow sampler takes those below its share."""
    digest = hashlib.sha256(trajectory_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class SelfJudge:
    """The served model as judge: one judge per rubric, trajectories of one rubric judged
    together (the judge compares those of one task with each other)."""

    def __init__(self, rubrics: Rubrics, make_judge: JudgeFactory) -> None:
        self.rubrics = rubrics
        self.make_judge = make_judge
        self._judges: dict[str, Grader] = {}

    def rubric(self, trajectory: Trajectory) -> Rubric | None:
        return self.rubrics.for_type(trajectory.interaction_type)

    def judge(self, trajectories: list[Trajectory], tasks: TaskTable) -> list[SelfJudgeEntry]:
        """One detail entry per trajectory: reward and the judge's detail, or error."""
        entries: dict[int, SelfJudgeEntry] = {}
        by_rubric: dict[str, list[int]] = {}
        for index, trajectory in enumerate(trajectories):
            rubric = self.rubric(trajectory)
            assert rubric is not None, "a type that is off is never sent to the self-judge"
            by_rubric.setdefault(rubric.text, []).append(index)
        for text, members in by_rubric.items():
            judge = self._judge_for(text)
            batch = [trajectories[i] for i in members]
            try:
                grades = judge.grade(batch, tasks=tasks)
            except Exception as exc:  # a judge that broke its promise fails this batch only
                grades = [Grade.of_exception(f"{type(exc).__name__}: {exc}", exc)] * len(batch)
            for index, grade in zip(members, grades, strict=True):
                rubric = self.rubric(trajectories[index])
                source = rubric.source if rubric else None
                entries[index] = entry_of(trajectories[index].interaction_type, source, grade)
        return [entries[i] for i in range(len(trajectories))]  # each in one rubric's batch

    def _judge_for(self, rubric: str) -> Grader:
        if rubric not in self._judges:
            self._judges[rubric] = self.make_judge(rubric)
        return self._judges[rubric]

    def close(self) -> None:
        for judge in self._judges.values():
            close = getattr(judge, "close", None)
            if callable(close):
                close()


class DefaultGrader:
    """The learner's grader: the configured graders where they apply, the served model's
    own judgement elsewhere (see the module)."""

    def __init__(
        self,
        configured: CombinedGrader,
        *,
        kinds: frozenset[str],
        self_judge: SelfJudge | None,
        feedback: FeedbackGrader | None = None,
        shadow: ShadowSampler | None = None,
        shadow_judge: SelfJudge | None = None,  # default: self_judge
        shadow_inline: bool = True,
    ) -> None:
        """`shadow_inline`: grading judges its shadow sample itself (`onthejob regrade`);
        False where stored grades are judged beside grading (learner/shadow_judging.py)."""
        self.configured = configured
        self.kinds = kinds
        self.self_judge = self_judge
        self.shadow_judge = shadow_judge or self_judge
        self.feedback = feedback
        self.shadow = shadow
        self.shadow_inline = shadow_inline
        self.truth_source = "+".join(sorted(kinds))
        self.name = configured.name + (" (else self_judge)" if self_judge else "")

    def route(self, trajectory: Trajectory, tasks: TaskTable) -> str:
        """'judge_traffic', 'configured' or 'self_judge' (before feedback is looked at)."""
        if trajectory.interaction_type == JUDGE_TYPE:
            return "judge_traffic"
        if configured_applies(self.kinds, trajectory, tasks):
            return "configured"
        if self.self_judge is None or self.self_judge.rubric(trajectory) is None:
            return "configured"
        return "self_judge"

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        routes = [self.route(t, tasks) for t in trajectories]
        grades: list[Grade | None] = [None] * len(trajectories)
        truths: dict[int, str] = {}  # index -> source of its ground truth
        for i, route in enumerate(routes):
            if route == "judge_traffic":
                grades[i] = Grade.failed("the learner's own judge call: not graded, not trained on")
        configured = [i for i, route in enumerate(routes) if route == "configured"]
        for i, grade in zip(
            configured, self._each(self.configured, trajectories, configured, tasks), strict=True
        ):
            grades[i] = grade
            if TRUTH_KINDS.issuperset(self.kinds):
                truths[i] = self.truth_source
        judged = [i for i, route in enumerate(routes) if route == "self_judge"]
        judged = self._feedback_first(trajectories, judged, grades, truths, tasks)
        assert self.self_judge is not None or not judged
        if judged:
            entries = self.self_judge.judge([trajectories[i] for i in judged], tasks)  # type: ignore[union-attr]
            for i, entry in zip(judged, entries, strict=True):
                grades[i] = as_grade(entry)
        if self.shadow_inline:
            self._shadow(trajectories, grades, truths, tasks)
        return [g if g is not None else Grade.failed("not graded") for g in grades]

    def _feedback_first(
        self,
        trajectories: list[Trajectory],
        candidates: list[int],
        grades: list[Grade | None],
        truths: dict[int, str],
        tasks: TaskTable,
    ) -> list[int]:
        """People's word beats the model's: feedback already posted grades it. The rest (no
        feedback yet) are left to the self-judge."""
        if self.feedback is None or not candidates:
            return candidates
        left = []
        for i, grade in zip(
            candidates, self._each(self.feedback, trajectories, candidates, tasks), strict=True
        ):
            if grade.reward is not None and grade.error is None:
                grades[i] = Grade(
                    grade.reward, {"feedback": {"reward": grade.reward, "detail": grade.detail}}
                )
                truths[i] = "feedback"
            elif grade.error is not None and grade.transient:
                grades[i] = grade  # the store was away: ask again later, not the judge now
            else:
                left.append(i)
        return left

    def _shadow(
        self,
        trajectories: list[Trajectory],
        grades: list[Grade | None],
        truths: dict[int, str],
        tasks: TaskTable,
    ) -> None:
        graded = {}
        for i, source in truths.items():
            grade = grades[i]
            if grade is not None and grade.error is None and grade.reward is not None:
                graded[i] = (source, grade.reward)
        for i, entry in self.shadow_verdicts(trajectories, graded, tasks).items():
            grade = grades[i]
            assert grade is not None
            grades[i] = Grade(grade.reward, {**grade.detail, SELF_JUDGE: entry})

    def shadow_verdicts(
        self,
        trajectories: list[Trajectory],
        truths: dict[int, tuple[str, float]],
        tasks: TaskTable,
    ) -> dict[int, SelfJudgeEntry]:
        """The self-judge's verdicts on a sample of trajectories whose ground truth is known
        (index -> (source, reward)), each with its truth: index -> detail entry."""
        judge, sampler = self.shadow_judge, self.shadow
        if self.self_judge is None or judge is None or sampler is None:
            return {}
        by_task: dict[Any, list[int]] = {}  # judged together, as the self-judge would
        for i in truths:
            if judge.rubric(trajectories[i]) is None:
                continue
            if sampler.take(trajectories[i].id):
                key = trajectories[i].task_key
                by_task.setdefault(("task", key) if key is not None else ("id", i), []).append(i)
        verdicts: dict[int, SelfJudgeEntry] = {}
        for chosen in by_task.values():
            if sampler.over_time_budget():
                break  # the rest of the batch goes without: grading is waiting
            started = time.monotonic()
            entries = judge.judge([trajectories[i] for i in chosen], tasks)
            sampler.spend(time.monotonic() - started)
            for i, entry in zip(chosen, entries, strict=True):
                source, reward = truths[i]
                verdicts[i] = shadow_entry(entry, {"source": source, "reward": reward})
            if any(entry.get("transient") for entry in entries):
                sampler.pause()  # the judge is away: the rest of the batch goes without
                break
        return verdicts

    @staticmethod
    def _each(
        grader: Grader, trajectories: list[Trajectory], indices: list[int], tasks: TaskTable
    ) -> list[Grade]:
        if not indices:
            return []
        return grader.grade([trajectories[i] for i in indices], tasks=tasks)

    def close(self) -> None:
        self.configured.close()
        for judge in {id(j): j for j in (self.self_judge, self.shadow_judge) if j}.values():
            judge.close()


def build_default_grader(
    specs: list[str],
    *,
    judge_base_url: str,
    judge_model: str | None,
    self_judge: bool,
    rubrics: Rubrics,
    shadow: ShadowPolicy,
    feedback_source: Any,
    feedback_wait_seconds: float,
    command_timeout: float,
    judge_max_tokens: int = 1024,
    judge_reasoning_chars: int = 1500,
    judge_temperature: float = 0.0,
    judge_seed: int | None = None,
    signal_weights: SignalWeights | None = None,
    shadow_inline: bool = True,
) -> DefaultGrader:
    """The learner's grader from its settings (`onthejob learn` and `onthejob regrade`)."""
    from learner.graders.combine import build_graders, parse_spec
    from learner.graders.judge import JudgeGrader

    configured = build_graders(
        specs,
        judge_base_url=judge_base_url,
        judge_model=judge_model,
        feedback_source=feedback_source,
        feedback_wait_seconds=feedback_wait_seconds,
        command_timeout=command_timeout,
        signal_weights=signal_weights,
    )
    kinds = frozenset(parse_spec(spec)[0] for spec in specs)

    def judges(**client: Any) -> JudgeFactory:
        def make_judge(rubric: str) -> JudgeGrader:
            # model None: the model that served the trajectory, i.e. the model judges itself
            return JudgeGrader(
                judge_base_url,
                model=judge_model,
                rubric=rubric,
                name=SELF_JUDGE,
                max_tokens=judge_max_tokens,
                max_reasoning_chars=judge_reasoning_chars,
                temperature=judge_temperature,
                seed=judge_seed,
                **client,
            )

        return make_judge

    feedback = None
    if feedback_source is not None and "feedback" not in kinds:
        feedback = FeedbackGrader(feedback_source, wait_seconds=feedback_wait_seconds)
    return DefaultGrader(
        configured,
        kinds=kinds,
        self_judge=SelfJudge(rubrics, judges()) if self_judge else None,
        feedback=feedback,
        shadow=ShadowSampler(shadow),
        # a shadow verdict is worth one quick try, not a wait: its reward is decided already
        shadow_judge=SelfJudge(rubrics, judges(max_retries=0, timeout=30.0)),
        shadow_inline=shadow_inline,
    )
