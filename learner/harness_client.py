"""What the bundled harness programs share: a chat-completions client over plain HTTP, and
reading the question and the model's address the way every harness does.

The harnesses (learner/demo/harnesses/, learner/rollout/tool_tasks/agent.py) are black-box
programs started once a run, so this module is standard library only at run time: importing
the openai SDK cost 0.6 s of CPU per start on 2 cores. It reads no environment of its own:
each harness passes in its `os.environ`, whose protocol is OPENAI_BASE_URL (the proxy),
OPENAI_API_KEY (sent as a bearer token), ONTHEJOB_TASK (sent as the X-Onthejob-Task header,
the task key the grader finds the task by) and ONTHEJOB_PROMPT (the question, when no
argument gives it).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # standard library only at run time
    from store.json_types import JsonObject, JsonValue

Complete = Callable[..., "JsonObject"]  # (messages, **request fields) -> the reply's message


class ModelError(RuntimeError):
    """The model could not be reached, or answered with an error."""


def http_chat(
    base_url: str,
    model: str,
    *,
    timeout_s: float,
    api_key: str = "not-needed",
    headers: dict[str, str] | None = None,
) -> Complete:
    """A `Complete` that POSTs to `base_url`/chat/completions."""
    url = base_url.rstrip("/") + "/chat/completions"
    sent = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    sent.update(headers or {})

    def complete(messages: list[JsonObject], **fields: JsonValue) -> JsonObject:
        body = json.dumps({"model": model, "messages": messages, **fields}).encode()
        request = urllib.request.Request(url, data=body, headers=sent, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
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


def question(
    parser: argparse.ArgumentParser, prompt: str | None, environ: Mapping[str, str]
) -> str:
    """The question, stripped: `prompt`, else ONTHEJOB_PROMPT, else stdin; a usage error
    (exit 2) if there is none."""
    asked = (prompt or environ.get("ONTHEJOB_PROMPT") or sys.stdin.read()).strip()
    if not asked:
        parser.error("no question given (argument, ONTHEJOB_PROMPT or stdin)")
    return asked


def connect(
    parser: argparse.ArgumentParser, model: str, environ: Mapping[str, str], *, timeout_s: float
) -> Complete:
    """`http_chat` to the model at OPENAI_BASE_URL, with the run's key and task; a usage
    error (exit 2) if OPENAI_BASE_URL is not set."""
    base_url = environ.get("OPENAI_BASE_URL")
    if not base_url:
        parser.error("OPENAI_BASE_URL is not set (the proxy's URL, e.g. http://127.0.0.1:8080/v1)")
    task = environ.get("ONTHEJOB_TASK")
    return http_chat(
        base_url,
        model,
        timeout_s=timeout_s,
        api_key=environ.get("OPENAI_API_KEY", "not-needed"),
        headers={"X-Onthejob-Task": task} if task else None,
    )
