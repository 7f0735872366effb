"""proxy.recording.interaction: the interaction type of a trajectory (header, else fingerprint)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from starlette.requests import Request

from proxy.base.errors import BadRequest
from proxy.recording.interaction import (
    MESSAGES_READ,
    PREFIX_CHARS,
    RAW_CHARS,
    _prompt_digest,
    explicit_type,
    fingerprint,
    harness_of,
    normalise_prompt,
    system_text,
    tool_names,
)
from proxy.recording.rows import RowBuilder
from proxy.recording.stitching import TrajectoryTracker

CODER_PROMPT = (
    "You are a coding agent. Work in the repository.\n"
    "Working directory: /tmp/run-8121/work\nToday's date: 2026-12-01\nOS Version: 6.8.0-41"
)
SHOP_PROMPT = "You answer questions about our shop. Be brief."


def chat_body(system: str, tools: list[str], user: str = "hi") -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": [
            {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
            for n in tools
        ],
    }


def request_with(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "headers": raw, "path_params": {}})


def test_two_harnesses_with_different_prompts_and_tools_are_two_types() -> None:
    coder = fingerprint(chat_body(CODER_PROMPT, ["Read", "Write"]), "coder-cli/1.2.3")
    shop = fingerprint(chat_body(SHOP_PROMPT, ["lookup_order"]), "OpenAI/Python 1.109.1")
    assert coder != shop
    assert coder.startswith("auto:coder-cli:") and shop.startswith("auto:openai/python:")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("claude-cli/2.0.14 (external, cli)", "claude-cli/2.1.0 (external, sdk-cli)"),
        ("codex_cli_rs/0.46.0 (Ubuntu 22.04; x86_64) xterm", "codex_cli_rs/0.50.1 (Mac OS)"),
        ("OpenAI/Python 1.109.1", "OpenAI/Python 2.0.0"),
        ("my-agent-1.2", "my-agent-2.0.1"),
        ("Agent/v3", "agent/v4.1"),
    ],
)
def test_versions_of_one_harness_are_one_type(a: str, b: str) -> None:
    assert harness_of(a) == harness_of(b) != "unknown"
    body = chat_body(CODER_PROMPT, ["Read"])
    assert fingerprint(body, a) == fingerprint(body, b)


def test_harness_names() -> None:
    assert harness_of("claude-cli/2.0.14 (external, cli)") == "claude-cli"
    assert harness_of("codex_cli_rs/0.46.0 (Ubuntu 22.04; x86_64)") == "codex_cli_rs"
    assert harness_of("OpenAI/Python 1.109.1") == "openai/python"
    assert harness_of(None) == harness_of("") == harness_of("   ") == "unknown"


def test_per_run_details_of_a_system_prompt_do_not_split_a_type() -> None:
    other_run = (
        CODER_PROMPT.replace("/tmp/run-8121/work", "/home/someone/projects/x")
        .replace("2026-12-01", "2027-01-17")
        .replace("6.8.0-41", "5.15.0-1")
    )
    assert fingerprint(chat_body(CODER_PROMPT, ["Read"]), "c/1") == fingerprint(
        chat_body(other_run, ["Read"]), "c/1"
    )
    # past the prefix nothing counts (e.g. a git status with branch names)
    long = "Fixed instructions. " * (PREFIX_CHARS // 10)
    assert normalise_prompt(long + "branch main") == normalise_prompt(long + "branch dev")
    # but the words of the prompt do
    assert fingerprint(chat_body(CODER_PROMPT, ["Read"]), "c/1") != fingerprint(
        chat_body(CODER_PROMPT.replace("coding", "writing"), ["Read"]), "c/1"
    )


def test_tools_count_by_name_in_any_order_and_shape() -> None:
    one = chat_body(SHOP_PROMPT, ["b", "a"])
    two = chat_body(SHOP_PROMPT, ["a", "b", "a"])
    two["tools"][0]["function"]["description"] = "changed in a new version"
    assert fingerprint(one, "x") == fingerprint(two, "x")
    assert fingerprint(one, "x") != fingerprint(chat_body(SHOP_PROMPT, ["a"]), "x")
    anthropic = {"tools": [{"name": "Write", "input_schema": {}}, {"type": "web_search"}]}
    assert tool_names(anthropic) == ["Write", "web_search"]


def test_system_prompt_of_every_api() -> None:
    assert system_text({"system": [{"type": "text", "text": "A"}, {"text": "B"}]}) == "A\nB"
    assert system_text({"system": "A"}) == "A"
    responses = {"instructions": "A", "input": [{"role": "developer", "content": "B"}]}
    assert system_text(responses) == "A\nB"
    chat = {"messages": [{"role": "developer", "content": [{"type": "text", "text": "A"}]}]}
    assert system_text(chat) == "A"
    # one prompt through any API is one type
    bodies = [
        {"system": SHOP_PROMPT, "messages": [{"role": "user", "content": "hi"}]},
        {"instructions": SHOP_PROMPT, "input": "hi"},
        {"messages": [{"role": "system", "content": SHOP_PROMPT}]},
    ]
    assert len({fingerprint(b, "x/1") for b in bodies}) == 1
    assert fingerprint(None, None) == fingerprint({}, None)
    # a long first call is read at its start only
    late = [{"role": "user", "content": "u"}] * MESSAGES_READ + [{"role": "system", "content": "Z"}]
    assert system_text({"messages": late}) == ""


def test_the_header_is_checked() -> None:
    assert explicit_type(request_with({})) is None
    assert explicit_type(request_with({"X-Onthejob-Type": "support:refunds"})) == (
        "support:refunds"
    )
    for bad in ["", "a b", "x" * 201, "auto:mine", "tab\there"]:
        with pytest.raises(BadRequest) as caught:
            explicit_type(request_with({"X-Onthejob-Type": bad}))
        assert caught.value.code == "invalid_type_header" and caught.value.status == 400


def entry(body: dict[str, Any], user_agent: str | None, explicit: str | None) -> dict[str, Any]:
    return {
        "id": "c" + str(id(body)),
        "api": "chat.completions",
        "session_key": "s1",
        "started_at": 1000.0,
        "latency_ms": 1.0,
        "ttft_ms": None,
        "stream": False,
        "status": "ok",
        "http_status": 200,
        "error": None,
        "task_key": None,
        "interaction_type": explicit,
        "group_key": None,
        "fanout_parent": None,
        "upstream": None,
        "model": "m",
        "policy_version": None,
        "sampling": None,
        "request": body,
        "response": None,
        "capture": None,
        "user_agent": user_agent,
    }


def test_the_first_call_fixes_the_type_of_its_trajectory() -> None:
    builder = RowBuilder(TrajectoryTracker(idle_timeout=300))
    first = entry(chat_body(SHOP_PROMPT, ["a"]), "shop/1", None)
    later = entry(chat_body(CODER_PROMPT, ["b"]), "coder/2", "explicit")
    rows = builder.rows([first])
    (trajectory,) = rows["trajectories"]
    assert trajectory["interaction_type"] == fingerprint(first["request"], "shop/1")
    rows = builder.rows([later])
    assert rows["trajectories"][0]["id"] == trajectory["id"]
    assert rows["trajectories"][0]["interaction_type"] == trajectory["interaction_type"]
    # a header on a trajectory's first call is its type
    fresh = RowBuilder(TrajectoryTracker(idle_timeout=300)).rows([later])
    assert fresh["trajectories"][0]["interaction_type"] == "explicit"


def claude_code_sized_request(run: int) -> dict[str, Any]:
    """A request the size of Claude Code's first call: 16 KB of system prompt holding
    per-run paths, dates and a build id, a dozen tools with large schemas."""
    instructions = "".join(
        f"Rule {i}: when the user asks for a change, read the file first. é " for i in range(180)
    )
    context = f"Working directory: /tmp/run-{run}/work\nToday's date: 2026-12-{run % 28 + 1:02}\n"
    system = [
        {"type": "text", "text": f"billing: cc_version=2.1.{run}.{run:x}f;"},
        {"type": "text", "text": instructions[:3000] + context + instructions[3000:]},
    ]
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)}}
    tools = [
        {"name": f"Tool{i}", "description": "x" * 2000, "input_schema": schema} for i in range(12)
    ]
    return {"model": "m", "system": system, "tools": tools, "messages": [USER_MESSAGE]}


USER_MESSAGE = {"role": "user", "content": "Write hello.txt."}


def per_call_us(call: Callable[[Any], object], inputs: list[Any]) -> float:
    """The best of 5 passes over `inputs`, in microseconds a call: the least disturbed by
    whatever else the machine runs."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for value in inputs:
            call(value)
        best = min(best, time.perf_counter() - started)
    return best / len(inputs) * 1e6


def test_the_fingerprint_is_cheap_and_stable_across_runs() -> None:
    """Its cost is measured against one pass that splits and joins the same text, in the
    same run, so that a loaded machine slows both: normalising costs about 3 such passes;
    a pattern that backtracks per word (one that also took a path's word start) cost 8.5."""
    bodies = [claude_code_sized_request(run) for run in range(200)]
    assert len({fingerprint(b, "claude-cli/2.1.3") for b in bodies}) == 1
    windows = [system_text(b)[:RAW_CHARS] for b in bodies]
    one_pass = per_call_us(lambda text: " ".join(text.split()), windows)
    normalising = per_call_us(normalise_prompt, windows)

    def missed(body: dict[str, Any]) -> str:
        _prompt_digest.cache_clear()  # each prompt new to the cache
        return fingerprint(body, "claude-cli/2.1.3")

    miss = per_call_us(missed, bodies)
    hit = per_call_us(lambda body: fingerprint(body, "claude-cli/2.1.3"), bodies)
    print(
        f"a Claude-Code-sized request: normalising {normalising:.0f} us"
        f" ({normalising / one_pass:.1f} passes of {one_pass:.0f} us), fingerprint"
        f" {miss:.0f} us new prompt, {hit:.0f} us seen"
    )
    assert normalising < 5 * one_pass
    assert hit < miss / 3  # the cache spares the normalising
