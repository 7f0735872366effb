"""A trainer's expected probe logprobs, a modified checkpoint, and weights loaded into a replica
unverified: what the swap tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from learner.checkpoint import (
    load_model,
    save_checkpoint,
)
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import ExpectedLogprobs, Probe, current_version
from learner.swap.replicas import Replicas

# what the swap tests sample and probe with
PROMPT = "<|im_start|>user\nhello, what is the weather today?<|im_end|>\n<|im_start|>assistant\n"


def trainer_logprobs(model_dir: Path) -> ExpectedLogprobs:
    """What the trainer computes for ``model_dir``: float32 log-softmax at temperature 1."""
    return logprobs_of(load_model(model_dir))


def logprobs_of(model: Any) -> ExpectedLogprobs:
    """What ``model`` computes, as it is when called: float32 log-softmax at temperature 1."""

    def expected(prompt: list[int], completion: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0]
        logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
        return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()

    return expected


def modified_checkpoint(source: Path, out_dir: Path) -> tuple[Path, Any]:
    """A checkpoint whose tied embeddings (so also the LM head) are scaled: easy to tell apart."""
    model = load_model(source)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(3.0)
    return save_checkpoint(model, out_dir, source_dir=source), model


def serve_again(upstream: str, model_dir: Path, probe: Probe, version: str) -> None:
    """Put ``model_dir``'s weights back into ``upstream`` under ``version``, verified (what
    tests that change a shared replica's weights do when they end)."""
    restore = FullWeightPublisher([upstream], probe=probe, last_good=model_dir)
    result = restore.rollback(model_dir, version, expected=trainer_logprobs(model_dir))
    assert result.ok, result.error
    assert current_version(upstream) == version


def load_unverified(upstream: str, directory: Path) -> None:
    """Reload ``directory`` into ``upstream`` as it is, nothing verified (a stand-in for a
    replica that did not load what it was given), by the publisher's own calls on a replica:
    pause, reload, reset the prefix cache, resume."""
    replicas = Replicas([upstream], probe=Probe(prompt_token_ids=[]), timeout=120)
    with replicas.client() as client:
        replicas.pause(client, upstream)
        try:
            replicas.reload(client, upstream, directory)
            replicas.reset_prefix_cache(client, upstream)
        finally:
            replicas.resume(client, upstream, replicas.retries)
