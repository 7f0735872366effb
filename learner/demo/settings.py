"""`onthejob demo`'s settings: its flags are generated from these (cli/flags.py), and
each can come from the environment (ONTHEJOB_DEMO_*) too."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic_settings import BaseSettings

from store.settings_fields import command_config, setting

# the real pretrained model the demo learns on by default: it met the bar over three seeds
# and a control (docs/measurements/real-models.md) in 10 minutes of learning on 2 cores
DEFAULT_MODEL = "smollm2-135m"
REAL_MODEL_MINUTES = 10.0
TINY_MINUTES = 4.0


class DemoSettings(BaseSettings):
    model_config = command_config("ONTHEJOB_DEMO_")

    workdir: Path = setting(
        Path(".onthejob-demo"),
        "where the model cache, database, checkpoints, logs and chart go",
    )
    port: int = setting(8080, "proxy port")
    model: str | None = setting(
        None,
        "a name of `onthejob models list` (prepared on first use), a directory, or a Hugging "
        f"Face id, e.g. a 0.5B instruct model on a GPU box (default {DEFAULT_MODEL})",
        metavar="PATH_OR_HF_ID",
    )
    tiny: bool = setting(
        False,
        "the tiny demo instead: a tiny random-init model, warmed up to use a calculator tool "
        f"but to decline most questions, learns to answer them in {TINY_MINUTES:g} minutes",
    )
    seed: int = setting(0, "task sets and warm-up")
    minutes: float | None = setting(
        None,
        f"time for training rounds (default {REAL_MODEL_MINUTES:g}; --tiny: {TINY_MINUTES:g})",
    )
    max_steps: int | None = setting(None, "or stop after this many learner steps")
    train_tasks: int = setting(200, "tasks the agent trains on")
    heldout_tasks: int = setting(50, "tasks held out, for the evaluation before and after")
    eval_samples: int = setting(3, "runs per held-out task")
    tasks_per_round: int = setting(4, "tasks per training round")
    group_size: int = setting(8, "runs per task: one GRPO group")
    concurrency: int = setting(8, "harness runs at a time")
    learning_rate: float | None = setting(
        None, "learner's AdamW rate (default: the task recipe's, 5e-5 reading, 1e-4 calculator)"
    )
    tasks: Literal["auto", "calculator", "reading"] = setting(
        "auto",
        "the agent and its tasks: the calculator-tool agent, or one-reply reading questions "
        "(auto: reading on a real model, calculator with --tiny)",
    )
    batch_trajectories: int = setting(
        16, "learner trains once this many runs carry a signal (16: two groups)"
    )
    yield_to_traffic: float = setting(
        0.0,
        "learn --yield-to-traffic: a ready step waits up to SECONDS for vLLM to finish the "
        "round's calls (0: it trains while the next round runs, the faster on 2 cores)",
        metavar="SECONDS",
    )
    learner_threads: int | None = setting(
        None,
        "learn --torch-threads: the learner's torch threads (default: the learner's, half the "
        "cores beside a vLLM-CPU on this machine)",
    )
    step_wait: float = setting(
        60.0, "after a round, wait up to this long for the learner's new version"
    )
    model_cache: Path | None = setting(
        None,
        "where warmed-up demo models are cached (default: demo-warmups in the model cache, "
        "$ONTHEJOB_MODEL_CACHE or ~/.cache/onthejob/models)",
    )
    warmup_max_steps: int | None = setting(
        None,
        "most skill-phase warm-up steps before the demo gives up (default 3000); the warm-up "
        "ends as soon as its probe shows the skill",
    )
    temperature: float = setting(1.0, "the harness's sampling temperature (GRPO needs variety)")
    band_check: bool = setting(
        True,
        "stop when held-out success before learning is outside the learnable band "
        "(--no-band-check: go on)",
    )
    control: bool = setting(
        False,
        "a control run: the learner shuffles each step's rewards across its batch (learn "
        "--shuffle-rewards); what it gains is not the reward's doing",
    )
    dtype: Literal["auto", "bfloat16", "float32"] = setting(
        "auto",
        "what vLLM-CPU serves in and the trainer computes in (auto: bfloat16 on a CPU with "
        "AVX-512-BF16 or AMX, else float32)",
    )
    curriculum: bool = setting(
        False,
        "run the tiny demo as a two-stage curriculum instead: single-turn arithmetic question "
        "and answer, then the calculator-tool task (learner/demo/curriculum.py)",
    )
    curriculum_minutes: float = setting(
        10.0, "with --curriculum: time for its rounds and evals", metavar="M"
    )

    def demo_model(self) -> str | None:
        """The model the demo runs on; None: the warmed-up tiny one (--tiny, --curriculum)."""
        if self.model is not None:
            if self.tiny:
                raise SystemExit("demo: --tiny and --model name two models; give one")
            return self.model
        return None if self.tiny or self.curriculum else DEFAULT_MODEL
