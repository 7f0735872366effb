"""Hindsight distillation's parts (learner/hindsight.py): which signals give a hint, where the
hint goes in a recorded prompt (on the tiny model's real chat template), and which tokens the
hindsight term lands on."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from learner.hindsight import CONTROL, GAP_CLIP, HINT, Distilled, HintFrame, corrections, distilled
from store.samples import Sample
from store.turn_signals import Stored


def stored(
    call: str, rule: str, value: float, evidence: str = "No, it's 21.", weight: float = 1.0
) -> Stored:
    return Stored(call, 0, value, rule, evidence, "alice", weight)


def test_only_what_a_person_said_was_wrong_is_a_hint() -> None:
    found = corrections([
        stored("a", "corrected", -1.0),
        stored("b", "judged", -1.0, "Hmm, I get 21."),
        stored("c", "approved", 1.0, "Thanks!"),
        stored("d", "judged", 1.0, "Great."),
        stored("e", "tool_error", -1.0, "Traceback ..."),
        stored("f", "retried", -1.0, "What is 3*7?"),
        stored("g", "corrected", -1.0, weight=0.0),  # its key's signals are off
        stored("h", "corrected", -1.0, evidence="  "),
    ])  # fmt: skip
    assert found == {"a": "No, it's 21.", "b": "Hmm, I get 21."}


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    # as vLLM renders a chat request: the template's text, then its tokens
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_hint_is_a_user_message_just_before_the_reply(tokenizer: Any) -> None:
    frame = HintFrame.of(tokenizer)
    assert isinstance(frame, HintFrame), frame
    asked = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 3*7?"},
        {"role": "assistant", "content": "It is 24."},
        {"role": "user", "content": "And 2+2?"},
    ]
    hinted = frame.hinted(chat(tokenizer, asked), "No, that's wrong. It's 4.")
    assert hinted is not None
    correction = HINT.format(correction="No, that's wrong. It's 4.")
    as_template_renders = chat(tokenizer, [*asked, {"role": "user", "content": correction}])
    assert tokenizer.decode(hinted) == tokenizer.decode(as_template_renders)
    # a prompt that does not end where the model answers (a continued reply) gets no hint
    assert frame.hinted(chat(tokenizer, asked)[:-1], "No.") is None


def test_a_template_that_refuses_two_user_messages_in_a_row_gives_no_frame(tokenizer: Any) -> None:
    strict = copy.deepcopy(tokenizer)
    strict.chat_template = (
        "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]"
        "['role'] %}{{ raise_exception('roles must alternate') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    why = HintFrame.of(strict)
    assert isinstance(why, str) and "roles must alternate" in why


def sample_of_two_replies() -> Sample:
    sample = Sample("t")
    sample.extend([1, 2, 9], [10, 11, 12], [-0.5] * 3, call_id="answer")
    sample.extend([1, 2, 9, 10, 11, 12, 3, 9], [20, 21], [-0.5] * 2, call_id="reply")
    return sample


def hint_or_control(text: str) -> list[int]:
    """Token 6: the control message ("OK."); token 7: a correction."""
    return [6] if CONTROL in text else [7]


def test_the_term_lands_on_the_corrected_reply_only_clipped() -> None:
    frame = HintFrame(generation_prompt=[9], turn_before="", turn_after="", encode=hint_or_control)
    asked: list[tuple[list[int], list[int]]] = []

    def logprobs_of(context: list[int], reply: list[int]) -> list[float]:
        asked.append((context, reply))
        if 7 in context:  # the hinted context: token 10 far likelier, 11 less, 12 alike
            return [-0.1, -5.0, -1.0]
        assert 6 in context  # compared with the control message, not the bare context
        return [-9.0, -1.0, -1.0]

    stats = Distilled()
    out = distilled(sample_of_two_replies(), 0.5, {"answer": "No."}, frame, logprobs_of, 2.0, stats)
    assert asked == [([1, 2, 7, 9], [10, 11, 12]), ([1, 2, 6, 9], [10, 11, 12])]
    assert out.token_advantages is not None
    answer = out.token_advantages[3:6]
    assert answer == pytest.approx([0.5 + 2 * GAP_CLIP, 0.5 - 2 * GAP_CLIP, 0.5])
    # the other reply and the prompt keep the sample's own advantage
    assert out.token_advantages[:3] == [0.5] * 3 and out.token_advantages[6:] == [0.5] * 4
    assert stats.metrics() == {
        "hindsight_replies": 1.0,
        "hindsight_tokens": 3.0,
        "hindsight_unplaced": 0.0,
        "hindsight_gap_mean": pytest.approx((8.9 - 4.0 + 0.0) / 3),
    }


def flat(context: list[int], reply: list[int]) -> list[float]:
    return [0.0] * len(reply)


def test_masked_tokens_and_unplaceable_prompts_are_left_alone() -> None:
    frame = HintFrame(generation_prompt=[9], turn_before="", turn_after="", encode=lambda _: [7])
    sample = sample_of_two_replies()
    sample.loss_mask[3:6] = [False] * 3  # turn credit left the answer out
    stats = Distilled()
    out = distilled(sample, 1.0, {"answer": "No."}, frame, flat, 1.0, stats)
    assert out is sample and stats.replies == 0
    other = HintFrame(generation_prompt=[8], turn_before="", turn_after="", encode=lambda _: [7])
    out = distilled(sample_of_two_replies(), 1.0, {"reply": "No."}, other, flat, 1.0, stats)
    assert out.token_advantages is None and stats.unplaced == 1
