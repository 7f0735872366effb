"""Next-turn signals: the certain rules, each on the turn it judges, and nothing else."""

from __future__ import annotations

from typing import Any

from store.conversation import conversation
from store.next_turn import next_turn_signals, tool_failed, user_verdict
from store.trajectory_record import TrajectoryCall


def chat_call(cid: str, messages: list[dict[str, Any]], reply: dict[str, Any]) -> TrajectoryCall:
    return TrajectoryCall(cid, "chat.completions", request={"messages": messages},
                          response={"choices": [{"message": reply}]})  # fmt: skip


def calls_tool(call_id: str) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "sh", "arguments": "{}"}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def say(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def test_a_failed_tool_call_is_a_signal_on_the_turn_that_made_it() -> None:
    asked = [{"role": "user", "content": "run the tests"}]
    trace = "Traceback (most recent call last):\n  File x\nValueError: boom"
    failed = {"role": "tool", "tool_call_id": "t1", "content": trace}
    calls = [
        chat_call("a", asked, calls_tool("t1")),
        chat_call("b", [*asked, calls_tool("t1"), failed], calls_tool("t2")),
        chat_call("c", [*asked, calls_tool("t1"), failed, calls_tool("t2"),
                        {"role": "tool", "tool_call_id": "t2", "content": "3 passed"}],
                  say("All green.")),
    ]  # fmt: skip
    messages = conversation(calls)
    [signal] = next_turn_signals(messages)
    assert (signal.call_id, signal.rule, signal.value) == ("a", "tool_error", -1.0)
    assert messages[signal.turn]["call_id"] == "a"
    assert signal.evidence.startswith("Traceback (most recent call last): File x")


def test_an_interruption_and_a_word_for_word_retry_are_signals() -> None:
    first = [{"role": "user", "content": "What is 6 x 7?"}]
    calls = [
        chat_call("a", first, say("43")),
        chat_call("b", [*first, say("43"), {"role": "user", "content": "what is 6 x 7? "}],
                  say("42")),
        chat_call("c", [*first, say("43"), {"role": "user", "content": "what is 6 x 7? "},
                        say("42"), {"role": "user", "content": "thanks"}], say("You're welcome")),
    ]  # fmt: skip
    retried, thanked = next_turn_signals(conversation(calls))
    assert (retried.call_id, retried.rule, retried.value) == ("a", "retried", -1.0)
    assert (thanked.call_id, thanked.rule, thanked.value) == ("b", "approved", 1.0)
    interrupted = [
        chat_call("a", first, calls_tool("t1")),
        chat_call("b", [*first, calls_tool("t1"),
                        {"role": "tool", "tool_call_id": "t1",
                         "content": "[Request interrupted by user for tool use]"},
                        {"role": "user", "content": "[Request interrupted by user]"}],
                  say("Stopped.")),
    ]  # fmt: skip
    [signal] = next_turn_signals(conversation(interrupted))
    assert (signal.call_id, signal.rule) == ("a", "interrupted")  # not a tool error


def test_anthropic_is_error_results_count_and_ordinary_ones_do_not() -> None:
    tool_use = {"type": "tool_use", "id": "tu1", "name": "sh", "input": {}}
    request = {"messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [tool_use]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu1", "content": "nope", "is_error": True}]},
    ]}  # fmt: skip
    calls = [
        TrajectoryCall("a", "messages", request={"messages": request["messages"][:1]},
                       response={"content": [tool_use]}),
        TrajectoryCall("b", "messages", request=request,
                       response={"content": [{"type": "text", "text": "ok"}]}),
    ]  # fmt: skip
    [signal] = next_turn_signals(conversation(calls))
    assert (signal.call_id, signal.rule, signal.evidence) == ("a", "tool_error", "nope")
    ok = {"role": "tool", "text": "exit code 0, 12 files", "is_error": False}
    assert not tool_failed({**ok, "tool_calls": [], "tool_call_id": None, "call_id": None})
    for text in ("bash: foo: command not found", "Process exited with code 2", "Error: no"):
        assert tool_failed({**ok, "text": text})


def test_a_reply_sent_back_re_serialised_still_gets_its_tool_error() -> None:
    # pydantic-ai on chat completions: arguments re-sent as compact JSON, arguments that were
    # not JSON wrapped as {"INVALID_JSON": ...}, and a turned-down call answered {"error": ...}
    asked = [{"role": "user", "content": "How tall is Varnholt in feet?"}]
    bad = calls_tool("t1")
    bad["tool_calls"][0]["function"]["arguments"] = '{"name": "Varnholt"'
    bad_back = calls_tool("t1")
    bad_back["tool_calls"][0]["function"]["arguments"] = (
        '{"INVALID_JSON":"{\\"name\\": \\"Varnholt\\""}'
    )
    good = calls_tool("t2")
    good["tool_calls"][0]["function"]["arguments"] = '{"name": "Varnholt", "field": "elevation_m"}'
    good_back = calls_tool("t2")
    good_back["tool_calls"][0]["function"]["arguments"] = (
        '{"field":"elevation_m","name":"Varnholt"}'
    )
    refused = '{"error":[{"type":"json_invalid","loc":[],"msg":"Invalid JSON: EOF"}]}'
    history = [*asked, bad_back, {"role": "tool", "tool_call_id": "t1", "content": refused}]
    calls = [
        chat_call("a", asked, bad),
        chat_call("b", history, good),
        chat_call("c", [*history, good_back,
                        {"role": "tool", "tool_call_id": "t2", "content": "Error: no entry"}],
                  say("I could not find it.")),
    ]  # fmt: skip
    messages = conversation(calls)
    assert "context" not in [m["role"] for m in messages]  # one conversation, not three
    first, second = next_turn_signals(messages)
    assert (first.call_id, first.rule, first.evidence) == ("a", "tool_error", refused)
    assert (second.call_id, second.rule, second.evidence) == ("b", "tool_error", "Error: no entry")


def test_only_an_object_holding_just_a_non_empty_error_is_an_error_result() -> None:
    def result(text: str) -> Any:
        return {"role": "tool", "text": text, "tool_calls": [], "tool_call_id": None,
                "call_id": None, "is_error": False}  # fmt: skip

    for text in ('{"error": "not found"}', ' {"error": [{"type": "missing"}]} '):
        assert tool_failed(result(text)), text
    others = ('{"error": null}', '{"error": ""}', '{"error": "x", "value": 3}', '{"errors": 0}')
    for text in (*others, '{"error": "x"', '[{"error": "x"}]', "the error: none"):
        assert not tool_failed(result(text)), text


def test_a_user_saying_the_answer_was_wrong_or_right_judges_the_agent_s_turn() -> None:
    asked = [{"role": "user", "content": "How many days are in 3 weeks?"}]
    calls = [
        chat_call("a", asked, calls_tool("t1")),
        chat_call("b", [*asked, calls_tool("t1"), {"role": "tool", "tool_call_id": "t1",
                                                   "content": "21"}], say("20")),
        chat_call("c", [*asked, calls_tool("t1"), {"role": "tool", "tool_call_id": "t1",
                                                   "content": "21"}, say("20"),
                        {"role": "user", "content": "No, that's wrong. It's 21."}], say("21")),
    ]  # fmt: skip
    # the user's verdict judges the agent's whole turn: the tool call that led to the answer
    # too, each on its own turn
    called, answered = next_turn_signals(conversation(calls))
    assert (answered.call_id, answered.rule, answered.value) == ("b", "corrected", -1.0)
    assert (called.call_id, called.rule, called.value, called.turn) == ("a", "corrected", -1.0, 1)
    assert answered.evidence == called.evidence == "No, that's wrong. It's 21."
    # a reply judged by a signal of its own keeps it
    failed = {"role": "tool", "tool_call_id": "t1", "content": "Error: division by zero"}
    for call in calls[1:]:
        assert call.request is not None
        call.request["messages"][2] = failed
    own, answered = next_turn_signals(conversation(calls))
    assert (own.call_id, own.rule) == ("a", "tool_error") and answered.rule == "corrected"


def test_only_certain_words_are_verdicts() -> None:
    wrong = (
        "No, that's wrong.",
        "no. try again",
        "Nope",
        "Wrong!",
        "Incorrect, it is 4",
        "That's not right: 12",
        "It is wrong",
        "You're wrong about that",
        "Not quite.",
    )
    right = ("Thanks!", "thank you", "That's correct.", "Yes, that's right", "Perfect")
    unsure = (
        "No problem",
        "no thanks",
        "No, thanks",
        "No, just the code please.",
        "No-code",
        "Not right now, later",
        "Perfect, now it fails with an error",
        "Exactly what I did not want",
        "Thanks, but that's wrong",
        "Are you sure? I get 42",
        "Use the calculator",
        "Great, now do 5 x 6",
        "Correct me if I'm wrong",
        "",
    )
    assert [user_verdict(t) for t in wrong] == [-1.0] * len(wrong)
    assert [user_verdict(t) for t in right] == [1.0] * len(right)
    assert [user_verdict(t) for t in unsure] == [None] * len(unsure)
