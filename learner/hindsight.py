"""Hindsight distillation (`learn --hindsight COEF`): a user's correction as token targets.

A reply the user corrected ("No, that's wrong. It's 21.") was sampled without that
knowledge. The same model with the correction in its context (the hindsight-conditioned
policy) puts other odds on the reply's tokens: lower on what the correction says is wrong,
higher on what it confirms. Each token of a corrected reply gets, beside its GRPO (or
per-turn) advantage, the extra advantage

    COEF x clamp(log p(token | context + correction) - log p(token | context + "OK."), +-3)

which is on-policy distillation from the hindsight-conditioned policy, on the tokens the
model sampled (OpenClaw-RL, arXiv 2603.10165, distils hints from the next message the same
way). The teacher is the policy itself, so nothing else needs serving: the correction, in
its own words, enters the recorded prompt as one more user message just before the reply,
in the chat template's own rendering of one. It is compared with the same message saying
nothing ("OK."), not with the context alone: a message the model never saw there makes
every token of its usual replies less likely (on the demo's tiny model by about 4 nats a
token), which says nothing about the reply, and distilled as it is, it unlearnt everything
(held-out 20% to 0% in 13 steps). A template that cannot render the message (one requiring
user and assistant to alternate) gives no hindsight: such replies train as they would
without it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from store.samples import Sample
from store.turn_signals import Stored

# signals whose evidence is what a person said was wrong (store/next_turn.py)
HINT_RULES = frozenset({"corrected", "judged"})
GAP_CLIP = 3.0  # nats: a token the correction makes e^3 (20x) likelier or less counts no more
# the correction as the user said it: on SmolLM2-135M, framing it ("Hindsight: the user's
# reply will be ...") lowered right and wrong answers alike, while the bare words lowered
# the wrong answer (-1.1 nats against "OK.") and left the right one (+0.1)
HINT = "{correction}"
CONTROL = "OK."  # the same message saying nothing: what the correction is compared with
_MARK = "\x00hint\x00"  # a string no template writes itself

Logprobs = Callable[[list[int], list[int]], list[float]]


def corrections(signals: Iterable[Stored]) -> dict[str, str]:
    """Call id -> the correction a person made of that reply, from its next-turn signals;
    signals of weight 0 (their key is off) give none."""
    return {
        s.call_id: s.evidence
        for s in signals
        if s.rule in HINT_RULES and s.value < 0 and s.weight > 0 and s.evidence.strip()
    }


@dataclass(frozen=True)
class HintFrame:
    """Where a hint's tokens go in a recorded prompt, learned once from the chat template:
    the prompt ends with the template's generation prompt (the assistant's header); the
    hint goes before it as a user message."""

    generation_prompt: list[int]
    turn_before: str  # a user message's rendering before its text
    turn_after: str  # and after it
    encode: Callable[[str], list[int]] = field(repr=False)

    @classmethod
    def of(cls, tokenizer: Any) -> HintFrame | str:
        """The tokenizer's frame, or why its chat template gives none."""

        def render(messages: list[dict[str, str]], generation: bool = False) -> str:
            return str(
                tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=generation
                )
            )

        asked = [{"role": "user", "content": "What is 2+2?"}]
        try:
            base = render(asked)
            generating = render(asked, generation=True)
            hinted = render([*asked, {"role": "user", "content": _MARK}])
        except Exception as error:
            return f"the chat template cannot render a second user message: {error}"
        if not (generating.startswith(base) and hinted.startswith(base) and _MARK in hinted):
            return "the chat template renders earlier messages differently as more follow"
        before, after = hinted[len(base) :].split(_MARK, 1)

        def encode(text: str) -> list[int]:
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])

        header = encode(generating[len(base) :])
        if not header:
            return "the chat template has no generation prompt"
        return cls(generation_prompt=header, turn_before=before, turn_after=after, encode=encode)

    def hinted(self, prompt: list[int], correction: str) -> list[int] | None:
        """`prompt` with the correction as a user message before the reply, or None when the
        prompt does not end with the generation prompt (a continued reply, a raw completion)."""
        n = len(self.generation_prompt)
        if len(prompt) <= n or prompt[-n:] != self.generation_prompt:
            return None
        text = self.turn_before + HINT.format(correction=correction) + self.turn_after
        return prompt[:-n] + self.encode(text) + self.generation_prompt


@dataclass
class Distilled:
    """What hindsight did in a step (its metrics)."""

    replies: int = 0  # corrected replies given hindsight targets
    tokens: int = 0
    unplaced: int = 0  # corrected replies whose prompt the frame could not place a hint in
    gaps: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {
            "hindsight_replies": float(self.replies),
            "hindsight_tokens": float(self.tokens),
            "hindsight_unplaced": float(self.unplaced),
            "hindsight_gap_mean": statistics.fmean(self.gaps) if self.gaps else 0.0,
        }


def distilled(
    sample: Sample,
    advantage: float,
    hints: Mapping[str, str],
    frame: HintFrame,
    logprobs_of: Logprobs,
    coef: float,
    stats: Distilled,
) -> Sample:
    """The sample with each corrected reply's trained tokens carrying the hindsight term
    beside the advantage they had (`advantage` when the sample has no per-token ones)."""
    if not any(call in hints for call in sample.call_ids):
        return sample
    per_token = (
        list(sample.token_advantages)
        if sample.token_advantages is not None
        else [advantage] * len(sample.token_ids)
    )
    changed = False
    for (start, end), call in zip(sample.completions, sample.call_ids, strict=True):
        if call not in hints or not any(sample.loss_mask[start:end]):
            continue
        context = sample.token_ids[:start]
        reply = sample.token_ids[start:end]
        teacher_context = frame.hinted(context, hints[call])
        if teacher_context is None:
            stats.unplaced += 1
            continue
        control = frame.hinted(context, CONTROL)
        assert control is not None  # the same prompt: placed as the hint was
        teacher = logprobs_of(teacher_context, reply)
        student = logprobs_of(control, reply)
        stats.replies += 1
        for offset, (t, s) in enumerate(zip(teacher, student, strict=True)):
            if not sample.loss_mask[start + offset]:
                continue
            gap = t - s
            stats.gaps.append(gap)
            stats.tokens += 1
            per_token[start + offset] += coef * max(-GAP_CLIP, min(GAP_CLIP, gap))
            changed = True
    return replace(sample, token_advantages=per_token) if changed else sample
