"""learner.graders.selfjudge: which grader a trajectory gets by default, and the shadow
verdicts the agreement figures come from. The judge here is a stub; the real one on vLLM is
in tests/e2e/test_selfjudge_vllm.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from learner.graders.base import Grade
from learner.graders.combine import build_graders
from learner.graders.feedback import FeedbackGrader, Posted
from learner.graders.judge import JUDGE_TYPE
from learner.graders.judge_prompt import DEFAULT_RUBRIC
from learner.graders.rubrics import Rubrics, RubricsError
from learner.graders.selfjudge import (
    DefaultGrader,
    SelfJudge,
    ShadowPolicy,
    ShadowSampler,
)
from store.tasks import Task, TaskTable
from store.trajectory_record import Trajectory
from tests.support.trajectories import answered

TASKS = TaskTable(
    {"mul": Task("mul", "6*7?", "42", match="numeric"), "open": Task("open", "Write a poem.")}
)


class StubJudge:
    """Scores every trajectory 0.7 and remembers what it was asked, with which rubric."""

    def __init__(self, rubric: str, asked: list[tuple[str, str]]) -> None:
        self.rubric = rubric
        self.asked = asked

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        self.asked += [(t.id, self.rubric) for t in trajectories]
        return [Grade(0.7, {"score": 7}) for _ in trajectories]


class Posts:
    def __init__(self, posted: dict[str, float]) -> None:
        self.posted = posted

    def reward_for(self, trajectory_id: str, session: str | None) -> Posted | None:
        reward = self.posted.get(trajectory_id)
        return None if reward is None else (reward, "a person said so")


def typed(answer: str, task_key: str | None, kind: str | None = None) -> Trajectory:
    return replace(answered(answer, task_key=task_key), interaction_type=kind)


def default_grader(
    specs: list[str],
    asked: list[tuple[str, str]],
    *,
    rubrics: Rubrics | None = None,
    shadow: float = 1.0,
    posted: dict[str, float] | None = None,
    self_judge: bool = True,
) -> DefaultGrader:
    judge = SelfJudge(rubrics or Rubrics(), lambda rubric: StubJudge(rubric, asked))
    return DefaultGrader(
        build_graders(specs),
        kinds=frozenset(spec.split(":")[0] for spec in specs),
        self_judge=judge if self_judge else None,
        feedback=FeedbackGrader(Posts(posted or {})),
        shadow=ShadowSampler(ShadowPolicy(share=shadow, per_minute=1000)),
    )


def test_no_grader_applies_so_the_model_judges_itself() -> None:
    asked: list[tuple[str, str]] = []
    grader = default_grader(["reference"], asked)
    no_task, no_answer = typed("hi", None), typed("roses are red", "open")
    grades = grader.grade([no_task, no_answer], tasks=TASKS)
    assert [g.reward for g in grades] == [0.7, 0.7]
    assert all(g.error is None for g in grades)
    assert grades[0].detail["self_judge"]["rubric"] == "default"
    assert "truth" not in grades[0].detail["self_judge"]  # nothing to compare it with
    assert asked == [(no_task.id, DEFAULT_RUBRIC), (no_answer.id, DEFAULT_RUBRIC)]


def test_a_reference_grades_and_the_shadow_judge_records_its_verdict_beside_it() -> None:
    asked: list[tuple[str, str]] = []
    grader = default_grader(["reference"], asked)
    right, wrong = typed("It is 42", "mul", "qa"), typed("It is 41", "mul", "qa")
    grades = grader.grade([right, wrong], tasks=TASKS)
    assert [g.reward for g in grades] == [1.0, 0.0]  # the reference decides the reward
    assert grades[0].detail["reference"]["reward"] == 1.0
    shadow = [g.detail["self_judge"] for g in grades]
    assert [s["truth"] for s in shadow] == [
        {"source": "reference", "reward": 1.0},
        {"source": "reference", "reward": 0.0},
    ]
    assert all(s["shadow"] and s["reward"] == 0.7 and s["type"] == "qa" for s in shadow)


def test_without_shadow_share_a_reference_costs_no_judge_call() -> None:
    asked: list[tuple[str, str]] = []
    grades = default_grader(["reference"], asked, shadow=0.0).grade(
        [typed("42", "mul")], tasks=TASKS
    )
    assert grades[0].reward == 1.0 and "self_judge" not in grades[0].detail
    assert asked == []


def test_posted_feedback_beats_the_self_judge_and_is_its_ground_truth() -> None:
    asked: list[tuple[str, str]] = []
    liked = typed("roses are red", "open")
    grades = default_grader(["reference"], asked, posted={liked.id: 0.2}).grade(
        [liked], tasks=TASKS
    )
    assert grades[0].reward == 0.2
    assert grades[0].detail["self_judge"]["truth"] == {"source": "feedback", "reward": 0.2}


def test_other_configured_graders_apply_to_everything() -> None:
    asked: list[tuple[str, str]] = []
    spec = "python:tests.support.sample_rewards:is_finished"
    grades = default_grader([spec], asked, shadow=0.0).grade([typed("x", None)], tasks=TASKS)
    assert grades[0].error is None and "self_judge" not in grades[0].detail
    assert asked == []


def test_rubrics_per_type_and_a_type_turned_off(tmp_path: Path) -> None:
    path = tmp_path / "rubrics.toml"
    path.write_text(
        'default = "Be strict."\n[types]\n"support" = "Is the customer helped?"\n"quiet" = false\n'
    )
    rubrics = Rubrics.load(path)
    asked: list[tuple[str, str]] = []
    grader = default_grader(["reference"], asked, rubrics=rubrics)
    support, other, quiet = (
        typed("a", None, "support"),
        typed("b", None, "x"),
        typed("c", None, "quiet"),
    )
    grades = grader.grade([support, other, quiet], tasks=TASKS)
    assert asked == [(support.id, "Is the customer helped?"), (other.id, "Be strict.")]
    assert grades[0].detail["self_judge"]["rubric"] == "type"
    # a type turned off is graded as without self-judging: the reference has nothing
    assert grades[2].reward is None and "no reference answer" in (grades[2].error or "")


def test_no_self_judge_grades_as_before() -> None:
    asked: list[tuple[str, str]] = []
    grades = default_grader(["reference"], asked, self_judge=False).grade(
        [typed("x", None)], tasks=TASKS
    )
    assert grades[0].transient and "no reference answer" in (grades[0].error or "")
    assert asked == []


def test_the_judges_own_traffic_is_never_judged_again() -> None:
    asked: list[tuple[str, str]] = []
    grades = default_grader(["reference"], asked).grade(
        [typed("{}", None, JUDGE_TYPE)], tasks=TASKS
    )
    assert grades[0].reward is None and not grades[0].transient
    assert asked == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("default = 3\n", "'default' must be"),
        ('colour = "x"\n', "unknown key 'colour'"),
        ('[types]\n"a" = true\n', "types.'a'"),
        ("default = \n", "rubrics.toml"),
    ],
)
def test_bad_rubrics_files_say_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rubrics.toml"
    path.write_text(text)
    with pytest.raises(RubricsError, match=message):
        Rubrics.load(path)


def test_the_shadow_sample_is_a_stable_share_within_a_rate() -> None:
    now = [0.0]
    ids = [f"traj-{i}" for i in range(2000)]
    half = ShadowSampler(ShadowPolicy(share=0.5, per_minute=10_000), clock=lambda: now[0])
    taken = {i for i in ids if half.take(i)}
    assert 850 < len(taken) < 1150  # about half, by the hash of the id
    again = ShadowSampler(ShadowPolicy(share=0.5, per_minute=10_000), clock=lambda: now[0])
    assert {i for i in ids if again.take(i)} == taken  # the same ones each time
    slow = ShadowSampler(ShadowPolicy(share=1.0, per_minute=6), clock=lambda: now[0])
    assert sum(slow.take(i) for i in ids[:20]) == 6  # a burst of one minute's worth
    now[0] += 30.0
    assert sum(slow.take(i) for i in ids[20:40]) == 3  # then 6 a minute


class AwayJudge:
    """A judge that cannot be reached."""

    def __init__(self, asked: list[str]) -> None:
        self.asked = asked

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        self.asked += [t.id for t in trajectories]
        return [Grade.retry("judge: Connection error.") for _ in trajectories]


def test_a_judge_that_is_away_pauses_the_shadow_verdicts_not_the_grades() -> None:
    asked: list[str] = []
    now = [0.0]
    sampler = ShadowSampler(
        ShadowPolicy(share=1.0, per_minute=1000, pause_after_failure=60), clock=lambda: now[0]
    )
    grader = DefaultGrader(
        build_graders(["reference"]),
        kinds=frozenset({"reference"}),
        self_judge=SelfJudge(Rubrics(), lambda rubric: StubJudge(rubric, [])),
        shadow=sampler,
        shadow_judge=SelfJudge(Rubrics(), lambda rubric: AwayJudge(asked)),
    )
    first, other = typed("42", "mul"), answered("7", task_key="other")
    tasks = TaskTable({**TASKS, "other": Task("other", "3+4?", "7", match="numeric")})
    grades = grader.grade([first, other], tasks=tasks)
    assert [g.reward for g in grades] == [1.0, 1.0]  # the references decide, judge or not
    assert grades[0].detail["self_judge"]["error"] == "judge: Connection error."
    assert asked == [first.id] and "self_judge" not in grades[1].detail  # not tried again
    assert "self_judge" not in grader.grade([typed("42", "mul")], tasks=tasks)[0].detail
    now[0] += 61
    assert "self_judge" in grader.grade([typed("42", "mul")], tasks=tasks)[0].detail


def test_shadow_judging_keeps_to_its_share_of_the_time() -> None:
    now = [0.0]
    policy = ShadowPolicy(share=1.0, per_minute=10_000, time_share=0.1, time_allowance=30.0)
    sampler = ShadowSampler(policy, clock=lambda: now[0])
    assert sampler.take("a")
    sampler.spend(30.0)  # a slow judge used the whole first allowance
    assert not sampler.take("b")
    now[0] = 50.0  # the budget is 30 + 5 s now: judging may go on
    assert sampler.take("c")
    sampler.spend(20.0)  # 50 s spent
    now[0] = 100.0  # against 30 + 10 s: none until 50 s are under a tenth of the time (after 200 s)
    assert not sampler.take("d")
    now[0] = 210.0
    assert sampler.take("e")
