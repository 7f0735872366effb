"""Which grade a run gets: check, task grader, --grader, reference answer, in that order."""

from __future__ import annotations

from typing import Any

from learner.graders.base import Grade
from learner.rollout.grading import SpecGraders, grade_reference, grade_run
from store.tasks import Task, TaskTable
from store.trajectory_record import Trajectory, TrajectoryCall


def trajectory(answer: str) -> Trajectory:
    response = {"choices": [{"message": {"role": "assistant", "content": answer}}]}
    return Trajectory(
        "t", (TrajectoryCall("c", "chat.completions", response=response),), task_key="k"
    )


def test_reference_against_the_final_message_then_stdout() -> None:
    task = Task(key="k", answer="42", match="numeric")
    by_message = grade_reference(task, trajectories=[trajectory("it is 42")], stdout="")
    assert by_message.reward == 1.0 and by_message.detail["source"] == "final_message"
    by_stdout = grade_reference(task, trajectories=[trajectory("no idea")], stdout="42\n")
    assert by_stdout.reward == 1.0 and by_stdout.detail["source"] == "stdout"
    assert grade_reference(task, trajectories=[], stdout="41").reward == 0.0


class Recording:
    def __init__(self) -> None:
        self.specs: list[str] = []

    def build(self, spec: str) -> Any:
        self.specs.append(spec)
        return _Fixed(float(len(self.specs)))


class _Fixed:
    def __init__(self, reward: float) -> None:
        self.reward = reward

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        return [Grade(reward=self.reward) for _ in trajectories]

    def close(self) -> None:
        pass


def test_order_check_then_task_grader_then_default_then_reference() -> None:
    recording = Recording()
    specs = SpecGraders(recording.build)
    checked = Grade(reward=0.5, detail={"check": "x"})
    tasks = TaskTable()

    def grade(task: Task, default: str | None, found: list[Trajectory]) -> Grade:
        return grade_run(
            task,
            tasks=tasks,
            default_grader=default,
            specs=specs,
            trajectories=found,
            stdout="4",
            check=lambda: checked,
        )

    full = Task(key="k", answer="4", grader="python:m:f", check="true")
    assert grade(full, "reference", [trajectory("4")]) is checked
    no_check = Task(key="k", answer="4", grader="python:m:f")
    assert grade(no_check, "judge", [trajectory("4")]).reward == 1.0
    assert recording.specs == ["python:m:f"]
    assert grade(Task(key="k", answer="5"), "judge", [trajectory("5")]).reward == 2.0
    assert recording.specs == ["python:m:f", "judge"]
    # built once each, shared by the runs
    assert grade(Task(key="k", answer="5"), "judge", [trajectory("5")]).reward == 2.0
    assert recording.specs == ["python:m:f", "judge"]
    assert grade(Task(key="k", answer="4"), None, [trajectory("no")]).reward == 1.0  # stdout
    nothing = grade(Task(key="k"), None, [trajectory("4")])
    assert nothing.reward is None and "no check, grader or answer" in (nothing.error or "")
    missing = grade(Task(key="k", grader="python:m:f"), None, [])
    assert missing.error and "no trajectory" in missing.error
