"""Claude Code, Codex CLI and Gemini CLI, unchanged, in a real tool loop through the proxy.

The upstream is scripted (tests/support/fake_vllm.py): it answers the first call with a
call of the harness's own file-writing tool (Claude Code's `Write`, Codex's `exec_command`
shell, Gemini CLI's `write_file`), the harness runs it for real in its temporary working
directory and sends the result back, and the second call gets a final answer. What is
checked: the file is there, the harness exited 0, its calls are one trajectory (stitched
from the messages alone, no session key), and the learner's `build_samples` makes one
training sequence of it from the recorded token ids, never re-tokenising text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store.conversation import conversation
from store.export import from_export
from store.next_turn import next_turn_signals
from store.samples import build_samples
from tests.support.fake_vllm import (
    LOGPROB,
    ToolLoopUpstream,
    has_tool_result,
    text,
    tool_call,
)
from tests.support.harness_clis import Run, claude_code, codex, gemini
from tests.support.records import export, wait_for_calls

CONTENT = "hello from the proxy\n"
FINAL = "I wrote hello.txt."


def _one_training_sequence(engine: Any, run: Run, api: str) -> None:
    wait_for_calls(engine, 2)
    (trajectory,) = export(engine)
    calls = trajectory["calls"]
    assert [c["api"] for c in calls] == [api, api], run.explain()
    assert all(c["status"] == "ok" and c["capture_complete"] for c in calls)
    first, last = calls
    (sample,) = build_samples(from_export(trajectory))
    print(f"{run.command[0]} printed {run.stdout!r}; {len(calls)} calls, 1 trajectory, 1 sample")
    assert sample.token_ids == last["prompt_token_ids"] + last["completion_token_ids"]
    assert sample.token_ids[: len(first["prompt_token_ids"])] == first["prompt_token_ids"]
    # only the two replies carry loss, with the logprobs vLLM (here: the script) reported
    trained = [t for t, on in zip(sample.token_ids, sample.loss_mask, strict=True) if on]
    assert trained == first["completion_token_ids"] + last["completion_token_ids"]
    assert {p for p, on in zip(sample.logprobs, sample.loss_mask, strict=True) if on} == {LOGPROB}


def test_claude_code_tool_loop(tokenizer, db_url, engine, start_proxy, tmp_path: Path):
    target = tmp_path / "claude" / "work" / "hello.txt"

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if has_tool_result(messages):
            return text(FINAL)
        return tool_call("call_write_1", "Write", {"file_path": str(target), "content": CONTENT})

    with ToolLoopUpstream(tokenizer, script) as upstream:
        proxy = start_proxy([upstream.url], db_url)
        run = claude_code(proxy.url, "tiny", "Write hello.txt.", tmp_path / "claude")
    assert run.returncode == 0, run.explain()
    assert target.read_text() == CONTENT
    assert FINAL in run.stdout
    _one_training_sequence(engine, run, "messages")
    # the file-writing tool's result reached the model as the harness wrote it
    tool_results = [m for m in upstream.requests[1]["messages"] if m["role"] == "tool"]
    assert "hello.txt" in tool_results[0]["content"]


def test_codex_tool_loop(tokenizer, db_url, engine, start_proxy, tmp_path: Path):
    target = tmp_path / "codex" / "work" / "hello.txt"

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if has_tool_result(messages):
            return text(FINAL)
        command = f"printf '{CONTENT.strip()}\\n' > hello.txt"
        return tool_call("call_shell_1", "exec_command", {"cmd": command})

    with ToolLoopUpstream(tokenizer, script) as upstream:
        proxy = start_proxy([upstream.url], db_url)
        run = codex(proxy.url + "/v1", "tiny", "Write hello.txt.", tmp_path / "codex")
    assert run.returncode == 0, run.explain()
    assert target.read_text() == CONTENT
    assert FINAL in run.stdout
    _one_training_sequence(engine, run, "responses")
    # Codex's instructions reached the model (as a system message) and its shell output too
    second = upstream.requests[1]["messages"]
    assert second[0]["role"] == "system" and "Codex" in second[0]["content"]
    assert "exited with code 0" in next(m for m in second if m["role"] == "tool")["content"]


def test_gemini_cli_tool_loop(tokenizer, db_url, engine, start_proxy, tmp_path: Path):
    target = tmp_path / "gemini" / "work" / "hello.txt"

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if has_tool_result(messages):
            return text(FINAL)
        return tool_call(
            "call_write_1", "write_file", {"file_path": str(target), "content": CONTENT}
        )

    with ToolLoopUpstream(tokenizer, script) as upstream:
        proxy = start_proxy([upstream.url], db_url)
        run = gemini(proxy.url, "tiny", "Write hello.txt.", tmp_path / "gemini", yolo=True)
    assert run.returncode == 0, run.explain()
    assert target.read_text() == CONTENT
    assert FINAL in run.stdout
    _one_training_sequence(engine, run, "gemini")
    # Gemini CLI's instructions reached the model as a system message, the tool's result too
    second = upstream.requests[1]["messages"]
    assert second[0]["role"] == "system" and "Gemini CLI" in second[0]["content"]
    result = next(m for m in second if m["role"] == "tool")
    assert result["tool_call_id"] == "call_write_1" and "hello.txt" in result["content"]


def test_a_failed_command_in_codex_is_a_next_turn_signal_on_the_call_that_ran_it(
    tokenizer, db_url, engine, start_proxy, tmp_path: Path
):
    """The harness runs the model's command for real and it fails: the reply that asked for
    it is judged by that result, read off the next call's request (store/next_turn.py)."""

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if has_tool_result(messages):
            return text(FINAL)
        return tool_call("call_shell_1", "exec_command", {"cmd": "ls /no/such/dir"})

    with ToolLoopUpstream(tokenizer, script) as upstream:
        proxy = start_proxy([upstream.url], db_url)
        run = codex(proxy.url + "/v1", "tiny", "List /no/such/dir.", tmp_path / "codex")
    assert run.returncode == 0, run.explain()
    wait_for_calls(engine, 2)
    (trajectory,) = export(engine)
    first, _ = trajectory["calls"]
    [signal] = next_turn_signals(conversation(from_export(trajectory).calls))
    print(f"codex's failed command judged {signal.call_id}: {signal.rule} ({signal.evidence!r})")
    assert (signal.call_id, signal.rule, signal.value) == (first["id"], "tool_error", -1.0)
    assert "No such file or directory" in signal.evidence or "code 2" in signal.evidence
