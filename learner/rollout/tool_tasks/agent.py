"""The tool tasks' bundled agent: a tool loop over the OpenAI chat-completions API, plain HTTP.

It gets one question (first argument, else ONTHEJOB_PROMPT, else stdin), offers the model
the family's three tools (calculator, convert, lookup), runs every tool call locally
(tools.py), sends the results back, and prints the model's final answer on stdout once it
answers without calling a tool. A malformed call (arguments that are not JSON, an unknown
tool, a wrong argument) gets a tool result saying what is wrong and the loop goes on; the
counts go to stderr as one line, `tool_agent: {"turns": ..., "tool_calls": ...,
"malformed": ..., "failed": ..., "answered": ...}`, which the rollout runner keeps with the
run. It knows only OPENAI_BASE_URL (the proxy, under the run's session key), OPENAI_API_KEY
(sent as a bearer token) and the model name; ONTHEJOB_TASK, when set, goes as the
X-Onthejob-Task header (the task key the grader finds the task by). Exit 0 whenever the
model was reached, answer or not; 1 if it could not be, or did not answer with a chat
completion (stderr: `tool_agent: the model failed: ...`, saying what it got).

Standard library only, as the demo's calculator agent: a rollout starts it once a run.

Run: onthejob rollout --proxy URL --tasks tools-train.jsonl -- \\
         python -m learner.rollout.tool_tasks.agent "{prompt}"
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from learner.rollout.tool_tasks.tools import FAILED, MALFORMED, TOOLS, run_tool

if TYPE_CHECKING:  # standard library only at run time
    from store.json_types import JsonObject, JsonValue

Complete = Callable[..., "JsonObject"]  # (messages, **request fields) -> the reply's message
SUMMARY_PREFIX = "tool_agent: "


class ModelError(RuntimeError):
    """The model could not be reached, or answered with an error."""


def http_chat(
    base_url: str, model: str, *, api_key: str = "not-needed", headers: dict[str, str] | None = None
) -> Complete:
    """A `Complete` that POSTs to `base_url`/chat/completions."""
    url = base_url.rstrip("/") + "/chat/completions"
    sent = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    sent.update(headers or {})

    def complete(messages: list[JsonObject], **fields: JsonValue) -> JsonObject:
        body = json.dumps({"model": model, "messages": messages, **fields}).encode()
        request = urllib.request.Request(url, data=body, headers=sent, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                reply = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise ModelError(f"{url} answered HTTP {exc.code}: {exc.read()[:300]!r}") from None
        except urllib.error.URLError as exc:
            raise ModelError(f"{url} could not be reached: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:  # e.g. a reply cut short
            raise ModelError(f"{url} broke off: {type(exc).__name__}: {exc}") from None
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            raise ModelError(f"{url} answered something not JSON: {exc}") from None
        return reply_message(reply, url)

    return complete


def reply_message(reply: JsonValue, url: str) -> JsonObject:
    """The assistant message of a chat completion `url` answered; ModelError if `reply` is
    not one."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise ModelError(f"{url} answered no chat completion: {_brief(reply)}")
    return dict(message)


def _brief(value: JsonValue) -> str:
    try:
        return json.dumps(value)[:300]
    except (ValueError, RecursionError):  # nested deeper than json.loads could still read
        return f"a JSON {type(value).__name__} nested too deep to show"


@dataclass
class Outcome:
    answer: str | None = None  # None: out of turns, the last reply still called tools
    turns: int = 0  # model calls
    tool_calls: int = 0
    malformed: int = 0  # calls that did not fit a tool's definition
    failed: int = 0  # well-formed calls a tool could not answer

    def summary(self) -> str:
        return SUMMARY_PREFIX + json.dumps({**asdict(self), "answered": self.answer is not None})


def solve(
    complete: Complete,
    prompt: str,
    *,
    max_turns: int = 6,
    max_tokens: int = 128,
    temperature: float = 1.0,
    system: str | None = None,
) -> Outcome:
    """Ask, run the tool calls, send the results, until the model answers without calling a
    tool or `max_turns` model calls were made."""
    messages: list[JsonObject] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    outcome = Outcome()
    for turn in range(max_turns):
        message = complete(messages, tools=TOOLS, max_tokens=max_tokens, temperature=temperature)
        outcome.turns += 1
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            content = message.get("content")
            outcome.answer = content if isinstance(content, str) else ""
            return outcome
        messages.append({k: v for k, v in message.items() if v is not None})
        for index, call in enumerate(calls):
            messages.append(run_call(call, f"call_{turn}_{index}", outcome))
    return outcome


def run_call(call: JsonValue, fallback_id: str, outcome: Outcome) -> JsonObject:
    """The tool message answering one of the model's calls, counted in `outcome`."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    name, arguments = function.get("name"), function.get("arguments")
    result = run_tool(
        name if isinstance(name, str) else None,
        arguments if isinstance(arguments, str | dict) else None,
    )
    outcome.tool_calls += 1
    outcome.malformed += result.error == MALFORMED
    outcome.failed += result.error == FAILED
    call_id = call.get("id")
    return {
        "role": "tool",
        "tool_call_id": call_id if isinstance(call_id, str) and call_id else fallback_id,
        "content": result.content,
    }


def question(prompt: str | None) -> str:
    if prompt:
        return prompt
    return os.environ.get("ONTHEJOB_PROMPT") or sys.stdin.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m learner.rollout.tool_tasks.agent",
        description=(__doc__ or "").splitlines()[0],
    )
    parser.add_argument("prompt", nargs="?", help="the question (else $ONTHEJOB_PROMPT or stdin)")
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-turns", type=int, default=6, help="model calls at most")
    parser.add_argument("--max-tokens", type=int, default=128, help="per model call")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--system", help="a system prompt (none by default)")
    args = parser.parse_args(argv)
    prompt = question(args.prompt).strip()
    if not prompt:
        parser.error("no question given (argument, ONTHEJOB_PROMPT or stdin)")
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        parser.error("OPENAI_BASE_URL is not set (the proxy's URL, e.g. http://127.0.0.1:8080/v1)")
    task = os.environ.get("ONTHEJOB_TASK")
    complete = http_chat(
        base_url,
        args.model,
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        headers={"X-Onthejob-Task": task} if task else None,
    )
    try:
        outcome = solve(
            complete,
            prompt,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            system=args.system,
        )
    except ModelError as exc:
        print(f"tool_agent: the model failed: {exc}", file=sys.stderr)
        return 1
    print(outcome.summary(), file=sys.stderr)
    print((outcome.answer or "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
