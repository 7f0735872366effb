"""What the demo model can do, measured in-process: the calculator agent's protocol played
with transformers sampling, on synthetic questions of its own.

The warm-up (learner/demo/warmup.py) is judged by this probe, not by its step count: the
same seed trains differently on different CPUs (kernels, summation order), so only what
the model does says whether it reached its intended starting point. The probe's questions
come from a seeded stream of their own ("onthejob-demo-probe-<seed>") and never include a
prompt passed in ``exclude`` (the demo passes its train and held-out tasks), so the probe
says nothing about the demo's tasks that the demo would not measure itself.

An episode is what the bundled harness (learner/demo/harnesses/calc_agent.py) does: ask,
run the calculator if the reply calls it, ask again, answer. Three numbers come out:

- ``success``: answered right (what the demo's reference grader counts);
- ``declined``: answered without calling the tool (the habit the demo's learner unlearns);
- ``skill``: success among the episodes that did call the tool (the competence the habit
  hides, and what held-out success can rise to once the habit is gone).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

from learner.demo.tasks import (
    CALCULATOR_TOOL,
    ChatMessage,
    DemoTask,
    calculate,
    format_number,
    make_task,
)

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ProbeFigures(TypedDict):
    """A `ProbeResult` as JSON (the warm-up's record, warmup.json)."""

    episodes: int
    temperature: float
    success: float
    declined: float
    skill: float


@dataclass(frozen=True)
class ProbeResult:
    episodes: int
    temperature: float
    success: float
    declined: float
    skill: float

    def as_dict(self) -> ProbeFigures:
        return cast(ProbeFigures, asdict(self))

    def describe(self) -> str:
        return (
            f"success {100 * self.success:.0f}%, declined {100 * self.declined:.0f}%, "
            f"right when it used the tool {100 * self.skill:.0f}% "
            f"({self.episodes} episodes at temperature {self.temperature:g})"
        )


@dataclass(frozen=True)
class Episode:
    task: DemoTask
    called: bool  # the first reply called the calculator
    answer: str  # the final reply, stripped

    @property
    def right(self) -> bool:
        return self.answer == self.task["answer"]


def render(tokenizer: Any, messages: list[ChatMessage], **kwargs: Any) -> str:
    """The prompt text exactly as vLLM renders it for the harness's request."""
    return str(
        tokenizer.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False, **kwargs)
    )


def parse_tool_call(text: str) -> str | None:
    """The calculator expression of a Hermes tool call in ``text``, else None."""
    found = _TOOL_CALL.search(text)
    if found is None:
        return None
    try:
        call = json.loads(found.group(1))
        expression = call["arguments"]["expression"]
    except (ValueError, KeyError, TypeError):
        return None
    return expression if call.get("name") == "calculator" and isinstance(expression, str) else None


def tool_turn(text: str) -> list[ChatMessage] | None:
    """What the harness appends after a reply that calls the calculator: that call and the
    tool's result (mistakes as short error texts, as the harness reports them); None when
    the reply calls no tool."""
    expression = parse_tool_call(text)
    if expression is None:
        return None
    try:
        result = format_number(calculate(expression))
    except ValueError as exc:
        result = f"error: {exc}"
    call = {"name": "calculator", "arguments": json.dumps({"expression": expression})}
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "c", "content": result},
    ]


def probe_tasks(seed: int, count: int, exclude: Iterable[str] = ()) -> list[DemoTask]:
    """``count`` distinct questions from the probe's own seeded stream, none in ``exclude``."""
    excluded = set(exclude)
    rng = random.Random(f"onthejob-demo-probe-{seed}")
    tasks: list[DemoTask] = []
    seen: set[str] = set()
    for _ in range(1000 * count):
        if len(tasks) == count:
            return tasks
        task = make_task(rng)
        if task["prompt"] in excluded or task["prompt"] in seen:
            continue
        seen.add(task["prompt"])
        tasks.append(task)
    raise ValueError(f"cannot draw {count} probe questions outside the excluded prompts")


def play(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[DemoTask],
    *,
    temperature: float = 1.0,
    samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 48,
) -> list[Episode]:
    """``samples`` agent episodes per task (task-major) with a model in memory."""
    import torch

    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        runs = [(task, [{"role": "user", "content": task["prompt"]}]) for task in tasks]
        runs = [(t, list(m)) for t, m in runs for _ in range(samples)]

        def generate(conversations: list[list[ChatMessage]]) -> list[str]:
            texts = [render(tokenizer, c, add_generation_prompt=True) for c in conversations]
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(
                    **batch,
                    do_sample=temperature > 0,
                    temperature=temperature if temperature > 0 else None,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max_new_tokens,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                )
            return tokenizer.batch_decode(
                out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
            )

        first = generate([m for _, m in runs])
        answers = [text.strip() for text in first]
        follow: list[int] = []
        for i, text in enumerate(first):
            turn = tool_turn(text)
            if turn is not None:
                runs[i][1].extend(turn)
                follow.append(i)
        if follow:
            for i, text in zip(follow, generate([runs[i][1] for i in follow]), strict=True):
                answers[i] = text.strip()
        called = set(follow)
        return [
            Episode(task, i in called, answer)
            for i, ((task, _), answer) in enumerate(zip(runs, answers, strict=True))
        ]
    finally:
        tokenizer.padding_side = padding_side
        torch.random.set_rng_state(generator_state)
        model.train(was_training)


def summarise(episodes: Sequence[Episode], temperature: float) -> ProbeResult:
    called = [e for e in episodes if e.called]
    total = max(1, len(episodes))
    return ProbeResult(
        episodes=len(episodes),
        temperature=temperature,
        success=round(sum(e.right for e in episodes) / total, 4),
        declined=round(1 - len(called) / total, 4),
        skill=round(sum(e.right for e in called) / len(called), 4) if called else 0.0,
    )


def probe(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[DemoTask],
    *,
    temperature: float = 1.0,
    samples: int = 1,
    seed: int = 0,
) -> ProbeResult:
    episodes = play(model, tokenizer, tasks, temperature=temperature, samples=samples, seed=seed)
    return summarise(episodes, temperature)


def sample_episodes(
    model_dir: Path,
    tasks: Sequence[DemoTask],
    *,
    temperature: float = 1.0,
    samples: int = 1,
    seed: int = 0,
    max_new_tokens: int = 48,
) -> list[str]:
    """Final answers of ``samples`` in-process agent episodes per task, task-major, for a
    model on disk (the offline estimate of what the harness gets from vLLM)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    episodes = play(
        model,
        tokenizer,
        tasks,
        temperature=temperature,
        samples=samples,
        seed=seed,
        max_new_tokens=max_new_tokens,
    )
    return [e.answer for e in episodes]
