"""A simulated user: asks the demo agent a task's question, then says in words whether the
answer was right, the way a person at a chat window would (bench/traffic_signals.py).

It runs the demo's agent loop itself (the calculator agent, or the one-reply agent with
``--agent qa``), reads the task's reference from ``--tasks`` (the user knows the answer),
and sends one more user message in the same conversation:
- when the answer was wrong, a correction ("No, that's wrong. It's 21."), and
- when it was right, an acknowledgement ("Thanks!"),
each drawn from a pool of phrasings of which only some open with words the next-turn rules
are certain of (store/next_turn.py): "Hmm, I get 21 when I work it out" and "OK, got it"
are left to a judge. The agent answers that message too (one call), so the proxy records
it in the same trajectory. Nothing else tells the learner how the answer did: no reward,
no feedback. It prints the agent's answer (before the user's reply) on stdout, for the
rollout runner's record.

Standard library only, like the demo's agents (it is started hundreds of times).

Run: OPENAI_BASE_URL=http://127.0.0.1:8080/v1 ONTHEJOB_TASK=<id> python -m
     bench.simulated_user "<question>" --tasks train.jsonl [--agent calc|qa]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

from learner.demo.harnesses.calc_agent import Complete, ModelError, http_chat, run_tool
from learner.demo.tasks import CALCULATOR_TOOL

# {answer}: the reference, as the user would say it; the first four of each pool open with
# words the rules read as certain, the rest are left to a judge
CORRECTIONS = (
    "No, that's wrong. It's {answer}.",
    "Wrong, the answer is {answer}.",
    "That's not right: I get {answer}.",
    "Incorrect. It should be {answer}.",
    "Hmm, I get {answer} when I work it out.",
    "Are you sure? I think it's {answer}.",
)
ACKNOWLEDGEMENTS = ("Thanks!", "That's right, thank you.", "Perfect.", "Thank you.", "OK, got it.")


def read_task(path: Path, key: str | None, prompt: str) -> dict[str, Any]:
    """The task row by its key (ONTHEJOB_TASK), else by its prompt."""
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("id") == key or (key is None and row.get("prompt") == prompt):
            return dict(row)
    raise SystemExit(f"simulated_user: no task {key or prompt!r} in {path}")


def is_right(reply: str, task: dict[str, Any]) -> bool:
    """The user's own check, as the reference grader's match kinds read it."""
    answer, kind = str(task["answer"]), task.get("match", "exact")
    if kind == "regex":
        return re.search(answer, reply) is not None
    if kind == "contains":
        return answer.casefold() in reply.casefold()
    if kind == "numeric":
        numbers = re.findall(r"-?\d+(?:\.\d+)?", reply)
        tolerance = float(task.get("tolerance", 1e-6))
        return bool(numbers) and abs(float(numbers[-1]) - float(answer)) <= tolerance
    return reply.strip() == answer.strip()


def spoken_answer(task: dict[str, Any]) -> str:
    """The reference as a person would say it (a reading task's answer is a pattern)."""
    return str((task.get("metadata") or {}).get("expected") or task["answer"])


def agent_turns(
    complete: Complete,
    messages: list[dict[str, Any]],
    *,
    tools: bool,
    max_turns: int,
    **sampling: Any,
) -> str:
    """The agent's loop on `messages` (extended in place): tool calls run until it answers."""
    offered = {"tools": [CALCULATOR_TOOL]} if tools else {}
    answer = ""
    for _ in range(max_turns):
        message = complete(messages, **offered, **sampling)
        answer = message.get("content") or ""
        calls = message.get("tool_calls") or []
        messages.append({k: v for k, v in message.items() if v is not None})
        if not calls:
            return answer
        for call in calls:
            function = call.get("function") or {}
            result = run_tool(function.get("name", ""), function.get("arguments", ""))
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
    return answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", help="the task's question")
    parser.add_argument("--tasks", type=Path, required=True, help="the task set (JSONL)")
    parser.add_argument("--agent", choices=("calc", "qa"), default="calc")
    parser.add_argument("--no-tools", dest="tools", action="store_false")
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        parser.error("OPENAI_BASE_URL is not set")
    key = os.environ.get("ONTHEJOB_TASK")
    task = read_task(args.tasks, key, args.prompt)
    complete = http_chat(
        base_url,
        args.model,
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        headers={"X-Onthejob-Task": key} if key else None,
    )
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    messages: list[dict[str, Any]] = [{"role": "user", "content": args.prompt}]
    turns = 3 if args.agent == "calc" else 1
    try:
        answer = agent_turns(complete, messages, tools=args.tools, max_turns=turns, **sampling)
        pool = ACKNOWLEDGEMENTS if is_right(answer, task) else CORRECTIONS
        said = random.choice(pool).format(answer=spoken_answer(task))
        messages.append({"role": "user", "content": said})
        agent_turns(complete, messages, tools=args.tools, max_turns=1, **sampling)
    except ModelError as exc:
        print(f"simulated_user: the model failed: {exc}", file=sys.stderr)
        return 1
    print(answer.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
