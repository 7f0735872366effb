"""Learner configuration: defaults < TOML file (--config) < ONTHEJOB_LEARN_* env < flags."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from store.url import DEFAULT_SQLITE_URL, given_database_url


@dataclass
class LearnerConfig:
    database_url: str = DEFAULT_SQLITE_URL
    upstreams: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000"])
    model: str = ""  # the base model directory (what vLLM was started with)
    checkpoints: str = "checkpoints"
    # retention (learner/retention.py): the last this many verified versions keep their
    # checkpoints, besides the serving one, its parent and pinned ones
    keep_checkpoints: int = 3
    graders: list[str] = field(default_factory=lambda: ["reference"])
    tasks: str | None = None  # JSONL task table loaded into the database at start
    # regression guard file (TOML, learner/guard.py): every new version is evaluated on each
    # guarded type's eval set and rolled back if it regresses one
    guard: str | None = None
    # learn only from the traffic of these client keys (by name; every call of a trajectory
    # must carry one); empty: from all traffic
    keys: list[str] = field(default_factory=list)
    lora: bool = False  # train a LoRA adapter (peft) instead of all weights
    lora_rank: int = 16  # vLLM's --max-lora-rank must be at least this
    lora_alpha: float = 32.0
    lora_targets: list[str] = field(
        default_factory=lambda: [
            *("q_proj", "k_proj", "v_proj", "o_proj"),
            *("gate_proj", "up_proj", "down_proj"),
        ]
    )
    learning_rate: float = 1e-5
    batch_trajectories: int = 16  # train once this many trajectories carry a signal
    # a step trains on at most this many trajectories with a signal (never fewer than
    # batch_trajectories; 0: no bound): the newest whole groups, the rest wait for later
    # steps or grow stale (max_staleness). 64 = 4 x batch_trajectories' default: a learner
    # that keeps up never meets it, one that fell behind (continuous traffic, vLLM on the
    # same cores) makes bounded steps instead of one on everything graded since its last
    # (256 trajectories a step made 3 steps in 240 s on 2 cores), and still holds several
    # whole GRPO groups (fan-out 8) a step
    max_batch_trajectories: int = 64
    max_staleness: int = 4
    # a step that is ready waits up to this many seconds while the replicas are running or
    # queueing requests (vLLM's /metrics), where the trainer shares their cores or GPU
    # (learner/traffic.py); 0: it trains at once
    yield_to_traffic: float = 0.0
    # the optimizer state (AdamW moments; under bf16 the float32 master weights: 12 bytes a
    # parameter, 1.6 GB for a 135M model, 5-8 s a step on 2 cores) goes beside every N-th
    # step's checkpoint and the serving one at a clean stop; a crash in between restarts
    # the moments. 1: every step; 0: only at a clean stop
    optimizer_state_every: int = 10
    # torch's threads for training (0: its default, one per core). Where vLLM-CPU serves on
    # the same cores, fewer: threads that outnumber the free cores wait on each other. A
    # GRPO step of SmolLM2 beside one busy core took 15.0 s on 1 thread and 25.8 s on 2
    # (bench/learner_step, 2 cores, float32)
    torch_threads: int = 0
    std_normalise: bool = False
    # a control run: every step's rewards are permuted across its batch before advantages,
    # so whatever such a run gains does not come from the reward (bench, demo --control)
    shuffle_rewards: bool = False
    # what a task seen once (no group, no running baseline) is compared with: its interaction
    # type's rewards under its policy version ("version"), in its batch only ("batch"), the
    # type's moving average ("ema"), or nothing: dropped ("off"); learner/type_baselines.py
    type_baseline: str = "version"
    clip_low: float = 0.2
    clip_high: float = 0.28
    max_importance_weight: float = 2.0
    # the clip bounds the ratio to the weights a step starts from ("proximal") or to those
    # that sampled the tokens ("behaviour"): learner/loss.py
    clip_against: str = "proximal"
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 8192
    # trained positions whose logprobs go through the LM head at once ([chunk, vocab] float32)
    logprob_chunk_tokens: int = 512
    # recompute decoder layer activations in the backward pass (less memory, more compute)
    activation_checkpointing: bool = False
    mask_truncated: bool = True
    # what the trainer computes in: "float32", "bfloat16" (bf16 forward and backward, float32
    # master weights and AdamW state; checkpoints in bf16), "autocast" (float32 weights, bf16
    # matmuls), or "auto": bfloat16 when every replica serves bfloat16 (full weights or a LoRA
    # adapter on a bf16 base), else float32
    precision: str = "auto"
    max_sequence_mismatch: float = 1.0
    # max |vLLM - trainer| probe logprob; None: by the dtype vLLM serves (float32 1e-3,
    # bfloat16 and float16 1e-2, or 1.0 where the weights were just compared exactly and
    # matched: learner/swap/publisher.py)
    verify_tolerance: float | None = None
    # seconds a swap waits for the replicas' traffic to drain before it aborts what is left
    swap_drain_timeout: float = 60.0
    poll_interval: float = 1.0
    max_steps: int | None = None  # stop after this many steps (None: run forever)
    judge_base_url: str | None = None
    judge_model: str | None = None
    # the served model judges what no configured grader applies to (learner/graders/selfjudge.py)
    self_judge: bool = True
    rubrics: str | None = None  # TOML file of rubrics per interaction type
    # share of the trajectories with a ground truth that the self-judge also judges (its
    # agreement figures), at most self_judge_per_minute of them a minute
    self_judge_shadow: float = 0.1
    self_judge_per_minute: float = 20.0
    judge_max_tokens: int = 1024
    judge_reasoning_chars: int = 1500
    judge_temperature: float = 0.0
    judge_seed: int | None = None  # servers that honour it (vLLM) then judge reproducibly
    command_timeout: float = 30.0
    # a grading that failed transiently is tried again after this many seconds, doubling up
    # to grade_retry_cap, grade_max_attempts times in all
    grade_retry_base: float = 30.0
    grade_retry_cap: float = 3600.0
    grade_max_attempts: int = 8
    feedback_wait: float = 3600.0
    device: str | None = None

    @classmethod
    def load(cls, *, config_file: Path | None, overrides: dict[str, Any]) -> LearnerConfig:
        values: dict[str, Any] = {}
        names = {f.name: f for f in fields(cls)}
        if config_file is not None:
            data = tomllib.loads(config_file.read_text())
            unknown = sorted(set(data) - set(names))
            if unknown:
                raise ValueError(f"{config_file}: unknown settings {', '.join(unknown)}")
            values.update(data)
        for name, spec in names.items():
            env = os.environ.get(f"ONTHEJOB_LEARN_{name.upper()}")
            if env is not None:
                values[name] = _parse_env(env, spec.type)
        if "database_url" not in values and (given := given_database_url()):
            values["database_url"] = given
        values.update({k: v for k, v in overrides.items() if v is not None})
        config = cls(**values)
        if not config.model:
            raise ValueError("--model is required: the base model directory vLLM serves")
        if config.rubrics:
            from learner.graders.rubrics import Rubrics

            Rubrics.load(config.rubrics)  # a mistake stops the start, not every grading
        if config.max_batch_trajectories < 0:
            raise ValueError(
                "max_batch_trajectories must be >= 0 (0: no bound), got "
                f"{config.max_batch_trajectories}"
            )
        if config.optimizer_state_every < 0:
            raise ValueError(
                "optimizer_state_every must be >= 0 (0: only at a clean stop), got "
                f"{config.optimizer_state_every}"
            )
        if config.torch_threads < 0:
            raise ValueError(
                f"torch_threads must be >= 0 (0: torch's default), got {config.torch_threads}"
            )
        if not config.yield_to_traffic >= 0:
            raise ValueError(
                f"yield_to_traffic must be >= 0 seconds (0: off), got {config.yield_to_traffic}"
            )
        if not 0.0 <= config.self_judge_shadow <= 1.0:
            raise ValueError(
                f"self_judge_shadow must be a share in [0, 1], got {config.self_judge_shadow}"
            )
        return config


def _parse_env(text: str, kind: Any) -> Any:
    kind = str(kind)
    if "list" in kind:
        return [part for part in text.split(",") if part]
    if "bool" in kind:
        return text.lower() in ("1", "true", "yes", "on")
    if "int" in kind and "None" not in kind:
        return int(text)
    if "float" in kind:
        return float(text)
    if "int" in kind:
        return int(text)
    return text
