"""A simulated user: asks the demo agent a task's question, then says in words whether the
answer was right, the way a person at a chat window would (bench/traffic_signals.py).

It runs the demo's agent loop itself (the calculator agent, or the one-reply agent with
``--agent qa``), knows the answer it expects (the task's reference, from ``--tasks``), and
judges the agent's answer by its own rule, not the reference grader's: a hurried reader
who accepts the answer when the expected number or word appears in it as a word of its own
("21 or 22" passes; the reference grader's match may not). Like a person it errs: with
``--noise`` (default 0.15) it judges the opposite of what it read, and with ``--silent``
(default 0.1) it leaves without a word. Otherwise it sends one more user message in the
same conversation:
- when it judged the answer wrong, a correction ("No, that's wrong."), and
- when it judged it right, an acknowledgement ("Thanks!"),
neither of which gives the answer away. Each is drawn from a pool of phrasings of which
only some open with words the next-turn rules are certain of (store/next_turn.py): "Hmm, I
get something else when I work it out" and "OK, got it" are left to a judge. The agent
answers that message too (one call), so the proxy records it in the same trajectory.
Nothing else tells the learner how the answer did: no reward, no feedback. Every draw
(silent, mistaken, phrasing) is seeded by ``--seed``, the task and the agent's answer, so a
rerun judges alike. It prints the agent's answer (before the user's reply) on stdout, for
the rollout runner's record.

Standard library only, like the demo's agents (it is started hundreds of times).

Run: OPENAI_BASE_URL=http://127.0.0.1:8080/v1 ONTHEJOB_TASK=<id> python -m
     bench.simulated_user "<question>" --tasks train.jsonl [--agent calc|qa] [--seed 3]
     [--noise 0.15] [--silent 0.1]
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

from learner.demo.harnesses.calc_agent import TIMEOUT_S, run_tool
from learner.demo.tasks import CALCULATOR_TOOL
from learner.harness_client import Complete, ModelError, http_chat

# the first four of each pool open with words the rules read as certain, the rest are left
# to a judge (tests/unit/bench/test_simulated_user.py checks the split); none gives the
# answer away: a real user need not know it, and the learner must not learn it from here
CORRECTIONS = (
    "No, that's wrong.",
    "Wrong, try again.",
    "That's not right.",
    "Incorrect.",
    "Hmm, I get something else when I work it out.",
    "Are you sure? I don't think so.",
    "That doesn't match what I have.",
    "Hm, my notes say otherwise.",
)
ACKNOWLEDGEMENTS = (
    "Thanks!",
    "That's right, thank you.",
    "Perfect.",
    "Thank you.",
    "OK, got it.",
    "Great, that's what I had.",
    "Cool.",
)
CERTAIN = 4  # of each pool, the phrasings the rules are certain of


def read_task(path: Path, key: str | None, prompt: str) -> dict[str, Any]:
    """The task row by its key (ONTHEJOB_TASK), else by its prompt."""
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("id") == key or (key is None and row.get("prompt") == prompt):
            return dict(row)
    raise SystemExit(f"simulated_user: no task {key or prompt!r} in {path}")


def expected_answer(task: dict[str, Any]) -> str:
    """The answer the user expects, as a person would say it (a reading task's reference
    is a pattern; its plain answer is in the metadata)."""
    return str((task.get("metadata") or {}).get("expected") or task["answer"])


def looks_right(reply: str, expected: str) -> bool:
    """The user's own reading, not the reference grader's match: the expected answer
    appears in the reply as a word of its own, wherever and whatever else it says."""
    pattern = rf"(?<![\w.]){re.escape(expected.strip())}(?![\w]|\.\d)"
    return re.search(pattern, reply, re.IGNORECASE) is not None


def user_reply(
    reply: str, task: dict[str, Any], *, rng: random.Random, noise: float, silent: float
) -> str | None:
    """What the user says after the agent's answer: None when it leaves without a word,
    else a correction or an acknowledgement, the verdict flipped with probability
    `noise` (a mistaken user)."""
    if rng.random() < silent:
        return None
    right = looks_right(reply, expected_answer(task))
    if rng.random() < noise:
        right = not right
    return rng.choice(ACKNOWLEDGEMENTS if right else CORRECTIONS)


def user_rng(seed: int, task: dict[str, Any], reply: str) -> random.Random:
    """The draws for one answer to one task: the same answer is judged alike on a rerun."""
    return random.Random(f"{seed}|{task.get('id')}|{task.get('prompt')}|{reply}")


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
    parser.add_argument("--seed", type=int, default=0, help="of the user's draws")
    parser.add_argument(
        "--noise", type=float, default=0.15, help="share of verdicts the user gets wrong"
    )
    parser.add_argument(
        "--silent", type=float, default=0.1, help="share of answers the user leaves unanswered"
    )
    args = parser.parse_args()
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        parser.error("OPENAI_BASE_URL is not set")
    key = os.environ.get("ONTHEJOB_TASK")
    task = read_task(args.tasks, key, args.prompt)
    complete = http_chat(
        base_url,
        args.model,
        timeout_s=TIMEOUT_S,
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        headers={"X-Onthejob-Task": key} if key else None,
    )
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    messages: list[dict[str, Any]] = [{"role": "user", "content": args.prompt}]
    turns = 3 if args.agent == "calc" else 1
    try:
        answer = agent_turns(complete, messages, tools=args.tools, max_turns=turns, **sampling)
        rng = user_rng(args.seed, task, answer)
        said = user_reply(answer, task, rng=rng, noise=args.noise, silent=args.silent)
        if said is not None:
            messages.append({"role": "user", "content": said})
            agent_turns(complete, messages, tools=args.tools, max_turns=1, **sampling)
    except ModelError as exc:
        print(f"simulated_user: the model failed: {exc}", file=sys.stderr)
        return 1
    print(answer.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
