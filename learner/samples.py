"""Training samples built from recorded token ids (never re-tokenised text).

A Sample is flat `token_ids` + `loss_mask` + `logprobs` of equal length. Stitching rule:
within a trajectory, a call's prompt + completion is merged with the next call when the next
call's prompt starts with exactly those tokens (the next turn extends the conversation);
otherwise a new sample starts. Loss is only on tokens the model sampled (completions);
prompt, tool output and environment tokens are masked. A call whose capture is incomplete
or failed contributes no trainable tokens and breaks the chain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NEUTRAL_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
# vLLM's threshold below which a temperature means greedy sampling
GREEDY_BELOW = 1e-5
# processors vLLM applies before it reports logprobs that the trainer does not model
UNMODELLED: dict[str, Any] = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": None,
}


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters vLLM applied, which its processed logprobs reflect."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class Sample:
    trajectory_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    # recorded vLLM logprob of each sampled token; 0.0 where the mask is False
    logprobs: list[float] = field(default_factory=list)
    sampling: Sampling = field(default_factory=Sampling)
    policy_versions: set[str | None] = field(default_factory=set)
    truncated: bool = False  # some completion hit max_tokens: masked (overlong filtering)

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)

    def extend(self, prompt: list[int], completion: list[int], logprobs: list[float]) -> None:
        """Append a call whose prompt starts with this sample's tokens."""
        new_context = prompt[len(self.token_ids) :]
        self.token_ids += new_context + completion
        self.loss_mask += [False] * len(new_context) + [True] * len(completion)
        self.logprobs += [0.0] * len(new_context) + list(logprobs)


def sampling_defaults(model_dir: Path) -> dict[str, Any]:
    """vLLM's defaults when a request sets nothing: the model's generation_config.json."""
    path = model_dir / "generation_config.json"
    defaults: dict[str, Any] = dict(NEUTRAL_SAMPLING)
    if path.exists():
        config = json.loads(path.read_text())
        for key in (*NEUTRAL_SAMPLING, *UNMODELLED):
            if config.get(key) is not None:
                defaults[key] = config[key]
    return defaults


def call_sampling(request: dict[str, Any] | None, defaults: dict[str, Any]) -> Sampling:
    request = request or {}

    def pick(key: str) -> Any:
        value = request.get(key)
        return defaults[key] if value is None else value

    temperature = float(pick("temperature"))
    if temperature < GREEDY_BELOW:
        # vLLM samples greedily and ignores top-p/top-k then: its logprobs are plain
        return Sampling()
    return Sampling(temperature=temperature, top_p=float(pick("top_p")), top_k=int(pick("top_k")))


def unmodelled_processing(request: dict[str, Any] | None, defaults: dict[str, Any]) -> str | None:
    """A logits processor the trainer does not reproduce, so vLLM's logprobs would not
    match: such calls are not trained on (run vLLM with `--generation-config vllm` to keep
    a model's own defaults, e.g. a repetition penalty, out of the way)."""
    request = request or {}
    for key, neutral in UNMODELLED.items():
        value = request.get(key, defaults.get(key))
        if value is not None and value != neutral:
            return key
    return None


def _trainable(call: dict[str, Any], defaults: dict[str, Any]) -> bool:
    return (
        unmodelled_processing(call.get("request"), defaults) is None
        and call.get("status") == "ok"
        and bool(call.get("capture_complete"))
        and call.get("prompt_token_ids") is not None
        and bool(call.get("completion_token_ids"))
    )


def build_samples(
    trajectory: dict[str, Any], *, defaults: dict[str, Any] | None = None
) -> list[Sample]:
    """Samples of one trajectory in the export format (see the README)."""
    defaults = defaults or NEUTRAL_SAMPLING
    samples: list[Sample] = []
    current: Sample | None = None
    for call in trajectory["calls"]:
        if not _trainable(call, defaults):
            current = None  # unknown tokens in between: nothing may extend across them
            continue
        prompt = list(call["prompt_token_ids"])
        completion = list(call["completion_token_ids"])
        sampling = call_sampling(call.get("request"), defaults)
        extends = (
            current is not None
            and current.sampling == sampling
            and prompt[: len(current.token_ids)] == current.token_ids
        )
        if not extends:
            current = Sample(trajectory_id=trajectory["id"], sampling=sampling)
            samples.append(current)
        assert current is not None
        current.extend(prompt, completion, call["completion_logprobs"])
        current.policy_versions.add(call.get("policy_version"))
        current.truncated |= call.get("finish_reason") == "length"
    return samples
