"""A trajectory's interaction type: what kind of interaction it is.

Explicit: the X-Onthejob-Type header of the trajectory's first call. Otherwise a fingerprint
of that call: `auto:<harness>:<hash>`, where the harness is the User-Agent's product token
without its version, and the hash covers the normalised system prompt and the sorted names
of the tools offered. The policy is one rule for every API and harness, never a case per
harness:

- system prompt: every system-like text of the request body, whatever the API: Anthropic's
  `system`, Responses' `instructions`, and the `system`/`developer` messages among the
  first MESSAGES_READ of `messages` (chat, and Messages too) or `input` (Responses), in
  that order.
- normalised: a harness fills its system prompt in per run (Claude Code: the working
  directory, today's date, the OS version, a build id in its first line, the git status;
  others a user name or a time), so a word's rest from its first slash or backslash (paths,
  URLs) becomes "/", from its first digit "0" (dots and dashes included: "2026-12-01",
  "2.1.332.0b8" and "2.1.332.abc" are all "0"), and whitespace runs become one space; then
  only the first PREFIX_CHARS characters count. The prefix is what keeps one harness one
  type when the variable part is not a number or path (Claude Code's git status lists
  branch names and commit subjects): harnesses put their fixed instructions first and the
  per-run context after them. Two prompts that differ only past the prefix are one type;
  an operator who wants them apart sends the header. A word's start before its first digit
  or slash stays: "run-8121" and "run-9" are one, "id-ab3f" and "id-ff3f" are two.
- tools: names only (`name`, chat's `function.name`, else the tool's `type` for built-in
  tools), deduplicated and sorted: schemas and descriptions change between versions of
  one harness without changing what kind of interaction it is.

The fingerprint runs once per trajectory, for its first call (proxy/recording/rows.py, in the writer
thread), on at most RAW_CHARS of system prompt whatever the size of the request; the
normalised prompt's digest is cached by the raw text, as a harness sends the same system
prompt again and again (Claude Code: every trajectory of one working directory and day).
Measured (tests/unit/proxy/recording/test_interaction.py prints it): ~5-10 us a trajectory when the
prompt was seen before, ~60-120 us when not, on a Claude-Code-sized request.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

from starlette.requests import Request

from proxy.base.errors import BadRequest
from proxy.base.record import CallEntry
from store.json_types import JsonObject

TYPE_HEADER = "x-onthejob-type"
MAX_TYPE = 200
AUTO_PREFIX = "auto:"
# normalised characters of system prompt that count (see the module docstring): enough for
# a harness's fixed instructions to tell it from another's, little enough to stay cheap
PREFIX_CHARS = 2048
# raw characters read to get them: normalising shortens text, rarely by half
RAW_CHARS = 2 * PREFIX_CHARS
_CACHED_PROMPTS = 1024
# system-like messages count among the first this many of `messages`/`input` only: a first
# call may carry a long conversation, and harnesses put their instructions at its start
# (Claude Code's environment goes in as a system message second, Codex's as developer
# messages first)
MESSAGES_READ = 16
_MAX_PRODUCT = 60

_EXPLICIT = re.compile(r"[A-Za-z0-9._:/@+=-]{1,200}")
# from the trigger to the word's end: a pattern that also took the word's start (\S*[/])
# tried every position of every word and cost ten times as much
_PATHS = re.compile(r"[/\\]\S*")
_DIGITS = re.compile(r"\d[\w.-]*")
_VERSION_SLASH = re.compile(r"/v?\d")
_VERSION_TAIL = re.compile(r"[-_.@]?v?\d[\w.+-]*$")
_PRODUCT_JUNK = re.compile(r"[^a-z0-9._/-]")
_SYSTEM_ROLES = ("system", "developer")


def explicit_type(request: Request) -> str | None:
    """The X-Onthejob-Type header, checked: 1-200 characters of letters, digits and
    `. _ : / @ + = -`; not starting with `auto:` (the fingerprints' namespace)."""
    value = request.headers.get(TYPE_HEADER)
    if value is None:
        return None
    if not _EXPLICIT.fullmatch(value) or value.startswith(AUTO_PREFIX):
        raise BadRequest(
            f"X-Onthejob-Type must be 1-{MAX_TYPE} characters of letters, digits and "
            "'._:/@+=-', not starting with 'auto:'",
            code="invalid_type_header",
        )
    return value


@functools.lru_cache(maxsize=_CACHED_PROMPTS)  # a handful of harnesses send nearly every call
def harness_of(user_agent: str | None) -> str:
    """The User-Agent's product token, lower case, without its version:
    "claude-cli/2.0.14 (external, cli)" -> "claude-cli", "OpenAI/Python 1.109.1" ->
    "openai/python", "" or None -> "unknown"."""
    if not user_agent:
        return "unknown"
    token = user_agent.split(None, 1)[0].lower() if user_agent.strip() else ""
    token = _VERSION_SLASH.split(token, 1)[0]
    token = _VERSION_TAIL.sub("", token)
    token = _PRODUCT_JUNK.sub("", token)[:_MAX_PRODUCT].strip("/.-_")
    return token or "unknown"


def system_text(body: JsonObject) -> str:
    """The system-like text of a request body, joined (see the module docstring): its
    first RAW_CHARS characters or more, from the first MESSAGES_READ messages."""
    parts: list[str] = []
    _add_text(parts, body.get("system"))
    _add_text(parts, body.get("instructions"))
    for key in ("messages", "input"):
        items = body.get(key)
        if isinstance(items, list):
            for item in items[:MESSAGES_READ]:
                if isinstance(item, dict) and item.get("role") in _SYSTEM_ROLES:
                    _add_text(parts, item.get("content"))
    return "\n".join(parts)


def normalise_prompt(text: str) -> str:
    """The part of a system prompt that identifies its kind (see the module docstring)."""
    text = _PATHS.sub("/", text[:RAW_CHARS])
    text = _DIGITS.sub("0", text)
    return " ".join(text.split())[:PREFIX_CHARS]


@functools.lru_cache(maxsize=_CACHED_PROMPTS)
def _prompt_digest(window: str) -> bytes:
    return hashlib.blake2b(
        normalise_prompt(window).encode("utf-8", "replace"), digest_size=8
    ).digest()


def tool_names(body: JsonObject) -> list[str]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    names: set[str] = set()
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        name = tool.get("name") or (function.get("name") if isinstance(function, dict) else None)
        name = name or tool.get("type")
        if isinstance(name, str):
            names.add(name)
    return sorted(names)


def fingerprint(body: Any, user_agent: str | None) -> str:
    """`auto:<harness>:<12 hex digits>` of a trajectory's first request body."""
    if not isinstance(body, dict):
        body = {}
    digest = hashlib.blake2b(digest_size=6)
    digest.update(_prompt_digest(system_text(body)[:RAW_CHARS]))
    digest.update(b"\x00")
    digest.update("\x1f".join(tool_names(body)).encode("utf-8", "replace"))
    return f"{AUTO_PREFIX}{harness_of(user_agent)}:{digest.hexdigest()}"


def type_of(entry: CallEntry) -> str:
    """A logged call's type: its explicit header, else its fingerprint."""
    explicit = entry.get("interaction_type")
    if explicit:
        return explicit
    return fingerprint(entry.get("request"), entry.get("user_agent"))


def _add_text(parts: list[str], content: Any) -> None:
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
