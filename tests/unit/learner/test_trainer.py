"""The trainer's logprobs match vLLM's processing, and a step moves the policy the right way."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from learner.trainer import (
    Trainer,
    TrainerConfig,
    micro_batches,
    processed_logprobs,
    token_history,
)
from store.samples import Sample, Sampling


def test_temperature_top_k_and_top_p_processing() -> None:
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])
    target = torch.tensor([[1]])
    plain = processed_logprobs(logits, target, Sampling())
    assert math.isclose(float(plain), float(torch.log_softmax(logits, -1)[0, 0, 1]), rel_tol=1e-6)
    hot = processed_logprobs(logits, target, Sampling(temperature=2.0))
    assert math.isclose(float(hot), float(torch.log_softmax(logits / 2, -1)[0, 0, 1]), rel_tol=1e-6)
    # top-k 2 keeps tokens 0 and 1 and renormalises over them
    top2 = processed_logprobs(logits, target, Sampling(top_k=2))
    assert math.isclose(float(top2), 1.0 - math.log(math.e**2 + math.e), rel_tol=1e-6)
    assert processed_logprobs(logits, torch.tensor([[3]]), Sampling(top_k=2)) == float("-inf")
    # top-p 0.5: token 0 alone holds ~0.64 of the mass, so only it survives
    assert float(processed_logprobs(logits, torch.tensor([[0]]), Sampling(top_p=0.5))) == 0.0


def test_top_p_among_the_top_k_drops_what_vllm_s_whole_sort_drops() -> None:
    from learner.trainer import _top_k_top_p, _top_p

    torch.manual_seed(0)
    z = torch.randn(64, 3000) * 3
    for k, p in ((20, 0.8), (5, 0.3), (200, 0.95), (1, 0.5)):
        kth = torch.topk(z, k, dim=-1).values[:, -1:]
        by_sort = (z < kth) | _top_p(z.masked_fill(z < kth, float("-inf")), p)
        assert torch.equal(_top_k_top_p(z, k, p), by_sort), (k, p)
    # a tie at the k-th value keeps every tied token, as vLLM's comparison does
    tied = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])
    assert _top_k_top_p(tied, 2, 0.99).tolist() == [[False, False, False, False, True]]


def test_min_p_drops_tokens_below_its_share_of_the_top_probability() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(logits, -1)[0]
    # min-p 0.3: token 2 has 0.13 of token 0's probability, token 1 0.37
    kept = processed_logprobs(logits, torch.tensor([1]), Sampling(min_p=0.3))
    assert math.isclose(float(kept), math.log(probs[1] / (probs[0] + probs[1])), rel_tol=1e-5)
    assert processed_logprobs(logits, torch.tensor([2]), Sampling(min_p=0.3)) == float("-inf")


def _penalised_by_hand(
    logits: torch.Tensor, ids: list[int], t: int, start: int, sampling: Sampling
) -> torch.Tensor:
    """vLLM's penalties for the position t of `ids`, one token at a time."""
    z = logits.clone()
    output = ids[start : t + 1]
    for token in set(ids[: t + 1]):
        value = float(z[token])
        penalty = sampling.repetition_penalty
        z[token] = value / penalty if value > 0 else value * penalty
    for token in set(output):
        z[token] -= sampling.frequency_penalty * output.count(token)
        z[token] -= sampling.presence_penalty
    return torch.log_softmax(z / sampling.temperature, -1)


def test_penalties_count_what_the_call_had_seen_as_vllm_does() -> None:
    torch.manual_seed(0)
    vocab = 7
    # call 1: prompt [1, 2], output [3, 3]; call 2 extends it: tool token 5, output [3, 6, 1]
    ids = [1, 2, 3, 3, 5, 3, 6, 1]
    completions = [(2, 4), (5, 8)]
    positions = torch.tensor([1, 2, 4, 5, 6])  # position t predicts ids[t + 1]
    starts = torch.tensor([2, 2, 5, 5, 5])
    logits = torch.randn(len(positions), vocab) * 2
    targets = torch.tensor([ids[t + 1] for t in positions.tolist()])
    sampling = Sampling(
        temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2
    )
    history = token_history(torch.tensor(ids), positions, starts, vocab)
    got = processed_logprobs(logits, targets, sampling, history)
    for i, t in enumerate(positions.tolist()):
        start = next(s for s, e in completions if s <= t + 1 < e)
        expected = _penalised_by_hand(logits[i], ids, t, start, sampling)[targets[i]]
        assert math.isclose(float(got[i]), float(expected), rel_tol=1e-5), (t, got[i], expected)


PLAIN = Sampling()


def sample(tokens: int, sampling: Sampling = PLAIN) -> Sample:
    return Sample(
        trajectory_id="t",
        token_ids=list(range(1, tokens + 1)),
        loss_mask=[False] + [True] * (tokens - 1),
        logprobs=[0.0] * tokens,
        sampling=sampling,
    )


def test_micro_batches_group_similar_lengths_within_the_budget() -> None:
    lengths = [10, 30, 12, 28, 11, 29]
    samples = [sample(n, Sampling(temperature=0.5 if n % 2 else 1.0)) for n in lengths]
    batches = list(micro_batches(samples, [float(n) for n in lengths], budget=64))
    for batch in batches:
        width = max(len(s.token_ids) for s in batch.samples)
        assert width * len(batch.samples) <= 64 or len(batch.samples) == 1
    # longest first, so the long ones pad only to each other: 30+29, 28+12 would waste more
    assert [[len(s.token_ids) for s in b.samples] for b in batches] == [
        [30, 29],
        [28, 12],
        [11, 10],
    ]
    assert sorted(a for b in batches for a in b.advantages) == sorted(map(float, lengths))


def _wide_model(vocab: int = 4096):
    """A random Qwen2 whose vocabulary dwarfs its width, like real models' heads."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=2,
        intermediate_size=128,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).to(torch.float32).eval()


def _penalised_batch(vocab: int, length: int = 200) -> list[Sample]:
    torch.manual_seed(1)
    sampling = Sampling(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    out = []
    for n in (length, length // 2):
        ids = torch.randint(0, vocab, (n,)).tolist()
        half = n // 2
        out.append(
            Sample(
                trajectory_id=f"t{n}",
                token_ids=ids,
                loss_mask=[False] * half + [True] * (n - half),
                logprobs=[0.0] * n,
                sampling=sampling,
                completions=[(half, n)],
            )
        )
    return out


def _logprobs_and_grads(trainer: Trainer, samples: list[Sample]):
    (batch,) = micro_batches(samples, [1.0] * len(samples), budget=10_000)
    tensors = trainer._tensors(batch)
    trainer.model.zero_grad(set_to_none=True)
    logprobs = trainer.token_logprobs(batch, tensors)
    finite = torch.where(tensors["mask"] & torch.isfinite(logprobs), logprobs, 0.0)
    finite.sum().backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    return logprobs.detach(), tensors["mask"], grads


def test_chunked_logprobs_and_checkpointing_change_nothing_but_memory() -> None:
    from learner.trainer import TokenHistory, token_history

    model = _wide_model()
    samples = _penalised_batch(model.config.vocab_size, length=120)
    whole = Trainer(model, TrainerConfig(logprob_chunk_tokens=10_000), device="cpu")
    reference, mask, reference_grads = _logprobs_and_grads(whole, samples)
    # the same thing computed the plain way: full logits, every position
    (batch,) = micro_batches(samples, [1.0, 1.0], budget=10_000)
    tensors = whole._tensors(batch)
    with torch.no_grad():
        logits = model(input_ids=tensors["ids"], attention_mask=tensors["attention"]).logits
    for row, s in enumerate(batch.samples):
        positions = mask[row].nonzero().squeeze(-1)
        starts = torch.full_like(positions, s.completions[0][0])
        history: TokenHistory = token_history(
            tensors["ids"][row, : len(s.token_ids)], positions, starts, logits.shape[-1]
        )
        plain = processed_logprobs(
            logits[row, positions], tensors["targets"][row, positions], s.sampling, history
        )
        torch.testing.assert_close(reference[row, positions], plain, rtol=0, atol=1e-5)
    for config in (
        TrainerConfig(logprob_chunk_tokens=16),
        TrainerConfig(logprob_chunk_tokens=16, activation_checkpointing=True),
    ):
        got, _, grads = _logprobs_and_grads(Trainer(model, config, device="cpu"), samples)
        torch.testing.assert_close(got, reference, rtol=0, atol=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6)


def test_no_full_vocabulary_float32_tensor_of_the_micro_batch_exists() -> None:
    from torch.profiler import ProfilerActivity, profile

    from learner.trainer import output_head, sample_logprobs

    model = _wide_model()
    config = TrainerConfig(logprob_chunk_tokens=16)
    samples = _penalised_batch(model.config.vocab_size, length=600)
    trainer = Trainer(model, config, device="cpu")
    (batch,) = micro_batches(samples, [1.0, 1.0], budget=10_000)
    tensors = trainer._tensors(batch)
    split = output_head(model)
    assert split is not None
    decoder, head = split
    with torch.no_grad():
        hidden = decoder(input_ids=tensors["ids"], attention_mask=tensors["attention"])
    features = hidden.last_hidden_state.requires_grad_()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        logprobs = sample_logprobs(features, head, batch, tensors, config)
        torch.where(tensors["mask"], logprobs, 0.0).sum().backward()
    trained = int(tensors["mask"].sum())
    whole = trained * model.config.vocab_size * 4  # one float32 [trained, vocab] tensor
    largest = max(e.self_cpu_memory_usage for e in prof.events())
    # the largest allocation of the head and vLLM's processing is a chunk's, not the batch's
    assert largest < whole / 4, (largest, whole)


def test_a_step_raises_the_logprob_of_rewarded_tokens(tmp_path: Path) -> None:
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m", seed=0))
    trainer = Trainer(model, TrainerConfig(learning_rate=1e-2), device="cpu")
    prompt, completion = [1, 10, 20, 30], [40, 50, 60]
    before = trainer.logprobs_of(prompt, completion)
    rewarded = Sample(
        trajectory_id="t",
        token_ids=prompt + completion,
        loss_mask=[False] * 4 + [True] * 3,
        logprobs=[0.0] * 4 + before,  # on-policy: behaviour logprobs equal the current ones
    )
    metrics = trainer.step([rewarded], [1.0])
    after = trainer.logprobs_of(prompt, completion)
    assert sum(after) > sum(before)
    assert metrics["trained_tokens"] == 3 and metrics["grad_norm"] > 0


def test_a_step_whose_every_sequence_mismatches_reports_them_dropped(tmp_path: Path) -> None:
    """Sequences whose recorded logprobs are far from the trainer's are left out; where that
    is every one, the step reports how many, so the step line names why nothing trained
    (it said "dropped: nothing" when a micro-batch was dropped whole)."""
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m", seed=0))
    trainer = Trainer(model, TrainerConfig(max_sequence_mismatch=0.5), device="cpu")
    prompt, completion = [1, 10, 20, 30], [40, 50, 60]
    current = trainer.logprobs_of(prompt, completion)
    samples = [
        Sample(
            trajectory_id=f"t{i}",
            token_ids=prompt + completion,
            loss_mask=[False] * 4 + [True] * 3,
            logprobs=[0.0] * 4 + [x + 3.0 for x in current],  # another policy's, far off
        )
        for i in range(3)
    ]
    metrics = trainer.step(samples, [1.0, -1.0, 0.5])
    assert metrics["skipped"] == "all sequences dropped"
    assert metrics["dropped_mismatch"] == 3
    assert trainer.logprobs_of(prompt, completion) == current  # no update


def test_the_kl_term_changes_the_update_and_is_reported(tmp_path: Path) -> None:
    import copy

    import pytest

    from learner.checkpoint import load_model
    from learner.loss import LossConfig
    from learner.tiny_model import build_tiny_model

    base = load_model(build_tiny_model(tmp_path / "m", seed=0))
    other = load_model(build_tiny_model(tmp_path / "r", seed=1))  # a reference unlike it
    with pytest.raises(ValueError, match="reference"):
        Trainer(copy.deepcopy(base), TrainerConfig(loss=LossConfig(kl_coef=0.5)), "cpu")
    prompt, completion = [1, 10, 20, 30], [40, 50, 60]
    updated = {}
    for kl in (0.0, 5.0):
        trainer = Trainer(
            copy.deepcopy(base),
            TrainerConfig(learning_rate=1e-2, loss=LossConfig(kl_coef=kl)),
            "cpu",
            reference=copy.deepcopy(other),
        )
        before = trainer.logprobs_of(prompt, completion)
        sample = Sample(
            trajectory_id="t",
            token_ids=prompt + completion,
            loss_mask=[False] * 4 + [True] * 3,
            logprobs=[0.0] * 4 + before,
        )
        metrics = trainer.step([sample], [1.0])
        assert ("kl" in metrics) == (kl > 0)
        updated[kl] = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    assert metrics["kl"] > 0
    assert not torch.allclose(updated[0.0], updated[5.0])


def _on_policy(trainer: Trainer, prompt: list[int], completion: list[int]) -> Sample:
    before = trainer.logprobs_of(prompt, completion)
    return Sample(
        trajectory_id="t",
        token_ids=prompt + completion,
        loss_mask=[False] * len(prompt) + [True] * len(completion),
        logprobs=[0.0] * len(prompt) + before,
    )


def test_bf16_computes_on_a_copy_of_float32_masters_that_keep_small_steps(
    tmp_path: Path,
) -> None:
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m", seed=0))
    # 1e-5 moves a weight far less than bf16's spacing near it (about 1e-4 at 0.02)
    trainer = Trainer(model, TrainerConfig(learning_rate=1e-5, precision="bfloat16"), "cpu")
    assert trainer.compute is not trainer.model
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.compute.parameters()} == {torch.bfloat16}
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = trainer.step([_on_policy(trainer, [1, 10, 20, 30], [40, 50, 60])], [1.0])
    assert metrics["trained_tokens"] == 3 and metrics["grad_norm"] > 0
    moved = {n: float((p.detach() - start[n]).abs().max()) for n, p in model.named_parameters()}
    # AdamW's first step moves every weight with a gradient by about the learning rate
    assert max(moved.values()) == pytest.approx(1e-5, rel=0.05)
    assert sum(m > 5e-6 for m in moved.values()) > len(moved) // 2, moved
    state = trainer.checkpoint_state()
    for name, master in trainer.model.state_dict().items():
        # what vLLM gets is the masters rounded to bf16, exactly the copy the trainer scores
        assert state[name].dtype == torch.bfloat16
        assert torch.equal(state[name], master.to(torch.bfloat16)), name
        assert torch.equal(state[name], trainer.compute.state_dict()[name]), name
    rounded = sum(
        torch.equal(state[n], start[n].to(torch.bfloat16)) for n in trainer.master_state()
    )
    assert rounded > 0  # a step this small leaves some weights' bf16 values where they were


def test_bf16_training_state_resumes_the_same_run(tmp_path: Path) -> None:
    from learner.checkpoint import load_model, save_checkpoint
    from learner.tiny_model import build_tiny_model

    source = build_tiny_model(tmp_path / "m", seed=0)
    config = TrainerConfig(learning_rate=1e-3, precision="bfloat16")
    first = Trainer(load_model(source), config, "cpu")
    batch = [_on_policy(first, [1, 10, 20, 30], [40, 50, 60, 70])]
    first.step(batch, [1.0])
    saved = save_checkpoint(
        first.model, tmp_path / "step", source_dir=source, state=first.checkpoint_state()
    )
    from safetensors import safe_open

    with safe_open(str(saved / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        assert "lm_head.weight" in set(f.keys())
    torch.save(first.training_state(), tmp_path / "state.pt")
    resumed = Trainer(load_model(saved), config, "cpu")  # bf16 weights, upcast
    resumed.load_training_state(torch.load(tmp_path / "state.pt", weights_only=True))
    for name, p in first.model.named_parameters():
        assert torch.equal(p, dict(resumed.model.named_parameters())[name]), name
    first.step(batch, [1.0])
    resumed.step(batch, [1.0])
    for (name, a), b in zip(
        first.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_autocast_and_bf16_score_alike_and_write_bf16(tmp_path: Path) -> None:
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    source = build_tiny_model(tmp_path / "m", seed=0)
    prompt, completion = [1, 10, 20, 30], list(range(40, 72))
    by = {
        precision: Trainer(load_model(source), TrainerConfig(precision=precision), "cpu")
        for precision in ("float32", "bfloat16", "autocast")
    }
    exact = torch.tensor(by["float32"].logprobs_of(prompt, completion))
    for precision in ("bfloat16", "autocast"):
        got = torch.tensor(by[precision].logprobs_of(prompt, completion))
        diff = float((got - exact).abs().max())
        assert 0 < diff < 0.05, (precision, diff)  # bf16 rounding, nothing worse
        assert {t.dtype for t in by[precision].checkpoint_state().values()} == {torch.bfloat16}


def test_samples_are_left_out_by_reason_and_cut_replies_by_the_truncation_rule() -> None:
    whole, cut_last, cut_before = sample(4), sample(4), sample(4)
    cut_last.truncated = True  # its trajectory's last reply hit max_tokens
    cut_before.truncated = cut_before.cut_before_last = True  # a reply before the last did
    empty = Sample(trajectory_id="t", token_ids=[1, 2], loss_mask=[False, False])
    last = Trainer(torch.nn.Linear(2, 2), TrainerConfig(), device="cpu")
    assert last.config.truncated == "last"  # the default
    assert [last.untrainable(s) for s in (whole, cut_last, cut_before, empty)] == [
        None, None, "truncated", "no_tokens",
    ]  # fmt: skip
    assert last.trainable([whole, cut_last, cut_before, empty]) == [whole, cut_last]
    masked = Trainer(torch.nn.Linear(2, 2), TrainerConfig(truncated="mask"), device="cpu")
    assert masked.trainable([whole, cut_last, cut_before, empty]) == [whole]
    train = Trainer(torch.nn.Linear(2, 2), TrainerConfig(truncated="train"), device="cpu")
    assert train.trainable([whole, cut_last, cut_before, empty]) == [whole, cut_last, cut_before]


def test_a_callers_own_loss_steps_the_masters_and_refreshes_the_bf16_copy() -> None:
    torch.manual_seed(0)
    config = TrainerConfig(precision="bfloat16")
    trainer = Trainer(torch.nn.Linear(4, 4), config, device="cpu")
    before = trainer.model.weight.detach().clone()
    optimizer = torch.optim.SGD(trainer.parameters, lr=0.1)
    trainer.compute(torch.ones(1, 4, dtype=torch.bfloat16)).sum().backward()
    trainer.apply_gradients(optimizer)
    # d(sum)/dW = 1 everywhere: SGD moved every float32 master by -0.1
    assert torch.allclose(trainer.model.weight, before - 0.1)
    assert trainer.model.weight.dtype == torch.float32
    assert torch.equal(trainer.compute.weight, trainer.model.weight.to(torch.bfloat16))
    assert trainer.compute.weight.grad is None and trainer.model.weight.grad is None
