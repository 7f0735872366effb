"""The `judge[:BASE_URL]` grader: an LLM scores a group of trajectories of one task against
each other, through any OpenAI-compatible endpoint (by default the served model itself).

Invariant: one chat call per group; any failure (transport, refusal, unreadable verdict)
becomes error Grades for that group only, never an exception.
"""

from __future__ import annotations

import httpx
import openai

from learner.graders.base import Grade
from learner.graders.extract import final_answer, task_prompt
from learner.graders.judge_prompt import (
    DEFAULT_RUBRIC,
    MAX_SCORE,
    build_messages,
    labels,
    parse_verdict,
    response_format,
)
from store.environment import environment
from store.json_types import JsonObject
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

# The judge's own calls say what they are (X-Onthejob-Type). By default they go straight to
# vLLM and are never recorded; a judge pointed at the proxy is recorded with this type, and
# the learner neither trains on nor judges trajectories of it (learner/graders/selfjudge.py).
JUDGE_TYPE = "onthejob-judge"
TYPE_HEADER = "X-Onthejob-Type"


def judge_client(
    base_url: str,
    *,
    api_key: str | None,
    timeout: float,
    max_retries: int,
    http_client: httpx.Client | None,
) -> openai.OpenAI:
    """An OpenAI client whose calls say they are the judge's (never traffic to learn from)."""
    return openai.OpenAI(
        base_url=base_url,
        # vLLM without --api-key accepts anything; the SDK insists on some key.
        api_key=api_key or _environment_key() or "EMPTY",
        timeout=timeout,
        max_retries=max_retries,
        http_client=http_client,
        default_headers={TYPE_HEADER: JUDGE_TYPE},
    )


class JudgeError(Exception):
    """The judge could not give a verdict for a group."""


class JudgeGrader:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,  # None: the model the trajectories used
        rubric: str = DEFAULT_RUBRIC,
        name: str = "judge",
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        seed: int | None = None,  # servers that honour it (vLLM) then sample reproducibly
        max_answer_chars: int = 4000,
        max_reasoning_chars: int = 1500,
        structured: bool = True,  # False for endpoints without json_schema response formats
        http_client: httpx.Client | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.rubric = rubric
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        self.max_answer_chars = max_answer_chars
        self.max_reasoning_chars = max_reasoning_chars
        self.structured = structured
        self.client = judge_client(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            http_client=http_client,
        )

    def close(self) -> None:
        self.client.close()

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        grades: list[Grade | None] = [None] * len(trajectories)
        for members in _groups(trajectories):
            group = [trajectories[i] for i in members]
            for index, grade in zip(members, self._grade_group(group, tasks), strict=True):
                grades[index] = grade
        return [g if g is not None else Grade.failed("not graded") for g in grades]

    def _grade_group(self, group: list[Trajectory], tasks: TaskTable) -> list[Grade]:
        answers = [final_answer(t) for t in group]
        judged = [i for i, answer in enumerate(answers) if answer is not None]
        grades = [Grade.failed("no final answer to judge (no successful reply)")] * len(group)
        if not judged:
            return grades
        texts = [answer for answer in answers if answer is not None]
        try:
            verdict_grades = self._judge(group[judged[0]], texts, tasks)
        except (JudgeError, openai.OpenAIError) as exc:
            # a judge that was unreachable, timed out or overloaded may answer later
            verdict_grades = [Grade.of_exception(f"judge: {exc}", exc)] * len(judged)
        for i, grade in zip(judged, verdict_grades, strict=True):
            grades[i] = grade
        return grades

    def _judge(self, first: Trajectory, answers: list[str], tasks: TaskTable) -> list[Grade]:
        names = labels(len(answers))
        model = self.model or _model_of(first) or self._served_model()
        text = self._ask(model, _prompt_of(first, tasks), answers, names)
        try:
            verdict = parse_verdict(text, names)
        except ValueError as exc:
            raise JudgeError(f"{exc} (model {model})") from exc
        common = {"reasoning": verdict.reasoning, "model": model, "candidates": len(names)}
        return [
            Grade(
                reward=verdict.scores[name] / MAX_SCORE,
                detail={"label": name, "score": verdict.scores[name], **common},
            )
            for name in names
        ]

    def _ask(self, model: str, prompt: str | None, answers: list[str], names: list[str]) -> str:
        messages = build_messages(
            prompt, answers, rubric=self.rubric, max_answer_chars=self.max_answer_chars
        )
        extra: JsonObject = {} if self.seed is None else {"seed": self.seed}
        if self.structured:
            extra["response_format"] = response_format(
                names, max_reasoning_chars=self.max_reasoning_chars
            )
        completion = self.client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]  # plain dicts of the documented shape
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            **extra,
        )
        if not completion.choices or not completion.choices[0].message.content:
            raise JudgeError(f"empty reply from {model}")
        choice = completion.choices[0]
        if choice.finish_reason == "length":
            raise JudgeError(f"reply cut at max_tokens={self.max_tokens} (model {model})")
        return choice.message.content or ""

    def _served_model(self) -> str:
        models = self.client.models.list().data
        if not models:
            raise JudgeError("no model given and the endpoint serves none")
        return models[0].id


def _groups(trajectories: list[Trajectory]) -> list[list[int]]:
    """Indices grouped by task key; a trajectory without one is compared with nothing else."""
    by_key: dict[str, list[int]] = {}
    groups: list[list[int]] = []
    for index, trajectory in enumerate(trajectories):
        key = trajectory.task_key
        if key is None:
            groups.append([index])
        elif key in by_key:
            by_key[key].append(index)
        else:
            by_key[key] = [index]
            groups.append(by_key[key])
    return groups


def _prompt_of(trajectory: Trajectory, tasks: TaskTable) -> str | None:
    key = trajectory.task_key
    task = tasks.get(key) if key is not None else None
    return task.prompt if task is not None and task.prompt else task_prompt(trajectory)


def _model_of(trajectory: Trajectory) -> str | None:
    models = [c.model for c in trajectory.calls if c.model]
    return models[-1] if models else None


def _environment_key() -> str | None:
    key = environment().openai_api_key
    return None if key is None else key.get_secret_value()
