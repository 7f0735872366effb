"""A recorded trajectory rendered again for the student: its own chat template and tokenizer,
a loss mask on the assistant turns alone.

The teacher's tokens are not the student's, so recorded token ids are never reused: the
conversation (messages.py) is rendered with `apply_chat_template` (with the request's tools)
and tokenised whole, exactly as the student's own rendering of those messages would be.

Every assistant turn is in the loss, not only the last: in an agent's trajectory the earlier
turns are the tool calls, which are what a student that cannot call tools has to learn, and
they led to the outcome that chose the trajectory. The other turns (system, user, tool
results) are context only.

Where an assistant turn lies is found by rendering prefixes, never by searching the text for
role markers: the render of messages[:i] with the generation prompt ends where turn i's own
tokens begin, and the render of messages[:i + 1] where they end (cut after the tokenizer's
end-of-turn token, what the model samples last). That holds only for a template whose render
of a conversation starts with the render of any earlier part of it (prefix-stable); one that
is not (it drops earlier reasoning, say) is refused. So are a template that cannot render the
conversation (an error, or tools, tool calls or a message that do not reach its text) and a
render longer than the context: each a counted drop with its reason, never an exception.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from learner.supervised.messages import ChatMessage, Conversation, conversation_of
from store.json_types import JsonObject
from store.samples import Sample
from store.trajectory_record import Trajectory


@dataclass
class Renderer:
    """Renders trajectories with `tokenizer` (a transformers fast tokenizer with a chat
    template): samples of at most `max_tokens` tokens."""

    tokenizer: Any
    max_tokens: int

    def render(self, trajectory: Trajectory) -> Sample | str:
        """The trajectory's sample, or why it has none."""
        conversation = conversation_of(trajectory)
        if isinstance(conversation, str):
            return conversation
        try:
            return self._sample(trajectory.id, conversation)
        except Exception:  # a template is arbitrary code: whatever it raises is its refusal
            return "template cannot render"

    def render_all(self, trajectories: Iterable[Trajectory]) -> tuple[list[Sample], Counter[str]]:
        """The samples of those that render, and the others counted by reason."""
        samples: list[Sample] = []
        dropped: Counter[str] = Counter()
        for trajectory in trajectories:
            rendered = self.render(trajectory)
            if isinstance(rendered, str):
                dropped[rendered] += 1
            else:
                samples.append(rendered)
        return samples, dropped

    def _text(
        self, messages: list[ChatMessage], tools: list[JsonObject], generation: bool = False
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
            )
        )

    def _sample(self, trajectory_id: str, conversation: Conversation) -> Sample | str:
        messages, tools = conversation.messages, conversation.tools
        full = self._text(messages, tools)
        if tools and self._text(messages, []) == full:
            return "template renders no tools"
        spans: list[tuple[int, int]] = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._text(messages[:i], tools, generation=True)
            through = self._text(messages[: i + 1], tools)
            if not (full.startswith(before) and full.startswith(through)):
                return "template not prefix-stable"
            if len(through) <= len(before):
                return "template not prefix-stable"
            spans.append(self._turn(full, len(before), len(through)))
            if not _shows(message, full[spans[-1][0] : spans[-1][1]]):
                return "template cannot render tool calls"
        if not all(_said(m, full) for m in messages if m["role"] != "assistant"):
            return "template cannot render a message"
        encoded = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids: list[int] = list(encoded["input_ids"])
        if len(ids) > self.max_tokens:
            return "longer than the context"
        mask = [any(s <= begin < e for s, e in spans) for begin, _ in encoded["offset_mapping"]]
        if not any(mask[1:]):  # position 0 predicts nothing
            return "no assistant tokens"
        return Sample(
            trajectory_id=trajectory_id,
            token_ids=ids,
            loss_mask=mask,
            logprobs=[0.0] * len(ids),
            completions=_runs(mask),
            call_ids=[conversation.call.id] * len(_runs(mask)),
        )

    def _turn(self, full: str, start: int, end: int) -> tuple[int, int]:
        """[start, end) of an assistant turn's text, cut after its end-of-turn token: the
        newline a template writes after it is no token the model samples."""
        eos = getattr(self.tokenizer, "eos_token", None)
        if isinstance(eos, str) and eos:
            at = full.rfind(eos, start, end)
            if at >= 0:
                return start, at + len(eos)
        return start, end


def _shows(message: ChatMessage, turn: str) -> bool:
    """Whether an assistant turn's text holds what it said and each tool call's name."""
    names = [call["function"]["name"] for call in message.get("tool_calls", [])]
    return _said(message, turn) and all(name in turn for name in names)


def _said(message: ChatMessage, text: str) -> bool:
    said = message["content"].strip()
    return not said or said in text


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each run of trained tokens (what a Sample calls its completions)."""
    runs: list[tuple[int, int]] = []
    for i, on in enumerate(mask):
        if on and (i == 0 or not mask[i - 1]):
            runs.append((i, i + 1))
        elif on:
            runs[-1] = (runs[-1][0], i + 1)
    return runs
