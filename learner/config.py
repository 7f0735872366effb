"""Learner settings: defaults < TOML file (--config) < ONTHEJOB_LEARN_* env < flags.

Each setting is written once, here: `onthejob learn`'s flags are generated from these fields
(cli/flags.py), and a test checks `.env.example` and docs/reference/configuration.md
against them.
"""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from store.settings_fields import comma_list, setting
from store.url import DATABASE_URL_ENV, DEFAULT_SQLITE_URL

# The --config file of the settings being built (a source is chosen per class, not per call).
_CONFIG_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "learner_config_file", default=None
)

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TRACKERS = ("tensorboard", "wandb", "mlflow")  # --report-to; learner/trackers.py


class LearnerConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ONTHEJOB_LEARN_",
        extra="forbid",  # a misspelt key in the TOML file stops the start
        env_ignore_empty=True,  # `NAME=` in a compose .env file means "not set"
        populate_by_name=True,
        validate_default=False,
    )

    # -- where things are ------------------------------------------------------------------
    database_url: str = setting(
        DEFAULT_SQLITE_URL,
        "database URL (postgresql://... or sqlite:///file.db); the environment's "
        f"${DATABASE_URL_ENV} when ONTHEJOB_LEARN_DATABASE_URL is not set",
        flag="--db",
        metavar="URL",
        validation_alias=AliasChoices("ONTHEJOB_LEARN_DATABASE_URL", DATABASE_URL_ENV),
    )
    migrate: bool = setting(
        False,
        "upgrade the database schema at start; without it a schema that is behind stops the "
        "command with what to run (`onthejob db upgrade`). A new SQLite file gets its schema "
        "anyway",
    )
    upstreams: Annotated[list[str], NoDecode] = setting(
        default_factory=lambda: ["http://127.0.0.1:8000"],
        help="vLLM server base URL; repeat for replicas (all get every version)",
        flag="--upstream",
        metavar="URL",
        repeat=True,
    )
    model: str = setting("", "base model directory vLLM was started on", metavar="DIR")
    checkpoints: str = setting("checkpoints", "where checkpoints go", metavar="DIR")
    keep_checkpoints: int = setting(
        3,
        "keep the checkpoints of the last K verified versions, besides the serving one, its "
        "parent and pinned ones (`onthejob pin`); delete the rest",
        metavar="K",
        ge=0,
    )
    device: str | None = setting(
        None, "torch device to train on (cuda, cpu; default: cuda when there is one)"
    )

    # -- grading ---------------------------------------------------------------------------
    graders: Annotated[list[str], NoDecode] = setting(
        default_factory=lambda: ["reference"],
        help="reference | next_turn[:judge] | python:MODULE:FUNCTION | command:SHELL_COMMAND | "
        "judge[:BASE_URL] | feedback, optionally SPEC@WEIGHT; repeat to combine",
        flag="--grader",
        metavar="SPEC",
        repeat=True,
    )
    signal_weights: Annotated[list[str], NoDecode] = setting(
        default_factory=list,
        help="how much a client key's next-turn signals count: NAME=WEIGHT (0: off, its "
        "trajectories get no next_turn grade), * for every key not named and for calls "
        "without a key; comma-separated, or repeat the flag; default 1",
        flag="--signal-weight",
        metavar="NAME=WEIGHT",
        repeat=True,
    )
    tasks: str | None = setting(
        None, "task table (JSONL) for the reference grader, loaded at start", metavar="FILE"
    )
    self_judge: bool = setting(
        True,
        "let the served model judge the trajectories no grader applies to (no reference "
        "answer, no feedback, only --grader reference given), with their interaction type's "
        "rubric",
    )
    rubrics: str | None = setting(
        None,
        "TOML file of the self-judge's rubrics: default = RUBRIC, and a [types] table of "
        "TYPE = RUBRIC, or TYPE = false to not self-judge that type",
        metavar="FILE",
    )
    self_judge_shadow: float = setting(
        0.1,
        "share of the trajectories with a ground truth (reference answer, check, feedback) "
        "that the self-judge also judges, for its agreement figures (0: none)",
        metavar="SHARE",
        ge=0.0,
        le=1.0,
    )
    self_judge_per_minute: float = setting(
        20.0, "at most N of those agreement judgements a minute", metavar="N", ge=0.0
    )
    judge_base_url: str | None = setting(
        None,
        "the judge grader's OpenAI-compatible endpoint (default: the first upstream)",
        metavar="URL",
    )
    judge_model: str | None = setting(
        None, "the judge's model (default: the one the endpoint serves)"
    )
    judge_max_tokens: int = setting(1024, "most tokens a judgement may take", ge=1)
    judge_reasoning_chars: int = setting(
        1500, "how much of a judgement's reasoning is kept with its grade", ge=0
    )
    judge_temperature: float = setting(0.0, "the judge's sampling temperature", ge=0.0)
    judge_seed: int | None = setting(
        None, "the judge's seed: servers that honour it (vLLM) then judge reproducibly"
    )
    command_timeout: float = setting(
        30.0, "seconds a command: grader may run", metavar="SECONDS", gt=0.0
    )
    grade_retry_base: float = setting(
        30.0,
        "a grading that failed transiently is tried again after this many seconds, doubling "
        "up to --grade-retry-cap, --grade-max-attempts times in all",
        metavar="SECONDS",
        gt=0.0,
    )
    grade_retry_cap: float = setting(
        3600.0, "longest wait between tries of a grading", metavar="SECONDS", gt=0.0
    )
    grade_max_attempts: int = setting(8, "tries of a grading before it is failed", ge=1)
    feedback_wait: float = setting(
        3600.0,
        "seconds the feedback grader waits for a reward posted to the proxy before the "
        "trajectory is graded without one",
        metavar="SECONDS",
        ge=0.0,
    )
    guard: str | None = setting(
        None,
        "regression guard (TOML): evaluate each new version on every guarded interaction "
        "type's eval task set and roll back one that regresses any (docs/rollouts.md); with "
        "--tenants, each tenant's versions on its own (docs/tenants.md)",
        metavar="FILE",
    )
    keys: Annotated[list[str], NoDecode] = setting(
        default_factory=list,
        help="learn only from the traffic of these client keys (their names, comma-separated; "
        "a trajectory counts when every call of it came with one of them); empty: all traffic",
        metavar="NAME,NAME",
    )

    # -- what a step trains on ------------------------------------------------------------
    batch_trajectories: int = setting(
        16, "train once this many trajectories carry a signal", metavar="N", ge=1
    )
    max_batch_trajectories: int = setting(
        32,
        "a step trains on at most N trajectories with a signal, the newest whole groups "
        "first; the rest wait for later steps or grow stale (--max-staleness). Never fewer "
        "than --batch-trajectories; 0: no bound. 32 holds 4 whole GRPO groups (fan-out 8); "
        "under continuous traffic beside vLLM on 2 cores it made 9 steps in 7 minutes where "
        "64 made 5, on samples 7-22 s old instead of 20-64 s (docs/measurements/defaults.md)",
        metavar="N",
        ge=0,
    )
    max_staleness: int = setting(
        4, "drop samples more than this many policy versions old", metavar="N", ge=0
    )
    type_baseline: Literal["version", "batch", "ema", "off"] = setting(
        "version",
        "what a task seen once (most organic traffic: no group, no running baseline of its "
        "own) is compared with: the mean of the other rewards of its interaction type and "
        "policy version (version), of its type and version in its batch (batch), its type's "
        "moving average (ema); off: it is not trained on",
    )
    credit: Literal["auto", "trajectory", "turn"] = setting(
        "auto",
        "what a trajectory's replies are trained with: its reward's advantage, spread over "
        "every reply (trajectory), or each reply a next-turn signal judged by that signal "
        "against its GRPO group's judged replies (alone in its group: its interaction "
        "type's replies in the batch), and the replies nothing judged left out (turn; needs "
        "next_turn grades); auto: turn when next_turn is the only grader, else trajectory",
    )
    hindsight: float = setting(
        0.0,
        "hindsight distillation (learner/hindsight.py): each token of a reply a person "
        "corrected also trains on COEF x how much likelier the model finds it with the "
        "correction in its context (a user message before the reply) than with a message "
        "saying nothing, clipped to +-3 nats; "
        "such replies train even in a group whose rewards are all alike; 0: off",
        metavar="COEF",
        ge=0.0,
    )
    std_normalise: bool = setting(
        False,
        "divide every step's trajectory advantages by their standard deviation (per-turn "
        "credit's are not)",
    )
    shuffle_rewards: bool = setting(
        False,
        "a control run: permute each step's rewards across its batch, so that a gain it "
        "shows cannot come from the reward",
    )
    truncated: Literal["last", "train", "mask"] = setting(
        "last",
        "replies cut at max_tokens: last trains a cut reply that is its trajectory's last "
        "reply (the one its grade was given on, scored as the client got it) and leaves out "
        "one that came before the last (later turns earned that grade); train: all of them; "
        "mask: none (overlong filtering)",
    )
    yield_to_traffic: float = setting(
        0.0,
        "where the trainer shares the replicas' cores or GPU: a ready step waits up to "
        "SECONDS while vLLM is running or queueing requests (its /metrics), then trains on a "
        "batch taken afresh, graded meanwhile included; 0: train at once",
        metavar="SECONDS",
        ge=0.0,
    )
    fresh_wait: float = setting(
        0.0,
        "a ready step first waits up to SECONDS until --batch-trajectories trajectories with "
        "a signal come from the serving version itself, grading meanwhile, then trains (the "
        "newest groups first). Where traffic outpaces steps (vLLM and the trainer on one "
        "machine), the samples answered while a step trains are a version old: on-policy "
        "steps learn more per step (docs/learner/run.md); 0: train at once",
        metavar="SECONDS",
        ge=0.0,
    )
    max_steps: int | None = setting(None, "stop after this many steps", metavar="N", ge=0)
    poll_interval: float = setting(
        1.0, "seconds between looks at the store", metavar="SECONDS", gt=0.0
    )

    # -- the optimizer and the loss -------------------------------------------------------
    learning_rate: float = setting(
        5e-5,
        "AdamW learning rate (full weights and LoRA alike): measured under continuous "
        "traffic on SmolLM2-135M and Gemma 3 270M in docs/measurements/defaults.md",
        gt=0.0,
    )
    step_kl: float = setting(
        0.02,
        "how far one GRPO step aims to move the policy, in nats a token (KL, measured on the "
        "samples of the version it trained from): the learning rate is scaled down from "
        "--learning-rate until a step moves it about this far; 0: --learning-rate as given",
        ge=0.0,
    )
    max_grad_norm: float = setting(1.0, "gradients are clipped to this norm", gt=0.0)
    clip_low: float = setting(0.2, "the loss clips ratios below 1 - CLIP_LOW", ge=0.0)
    clip_high: float = setting(0.28, "the loss clips ratios above 1 + CLIP_HIGH", ge=0.0)
    max_importance_weight: float = setting(
        2.0, "the truncated importance weight against the sampling policy", gt=0.0
    )
    clip_against: Literal["proximal", "behaviour"] = setting(
        "proximal",
        "the clip bounds the ratio to the weights a step starts from (proximal) or to those "
        "that sampled the tokens (behaviour); learner/loss.py",
    )
    kl_coef: float = setting(0.0, "weight of a KL penalty to the sampling policy", ge=0.0)

    # -- the supervised stage (learner/supervised/) ---------------------------------------
    supervised_steps: int = setting(
        0,
        "before GRPO, N supervised steps on recorded trajectories (--supervised-from), each "
        "rendered again with the served model's own chat template and tokenizer, "
        "cross-entropy on its assistant turns; then one verified swap, and GRPO goes on "
        "from the model's own traffic. Runs once: a learner restarted after it goes on with "
        "GRPO. 0: no stage",
        metavar="N",
        ge=0,
    )
    supervised_from: Literal["passed", "teacher"] = setting(
        "passed",
        "what the supervised stage trains on, newest first: passed, the finished trajectories "
        "graded with a reward of at least --supervised-min-reward; teacher, those whose last "
        "reply a teacher answered (`serve --teacher-url`), graded or not",
    )
    supervised_min_reward: float = setting(
        1.0, "the reward a trajectory needs to count as passed", metavar="REWARD"
    )
    supervised_batch: int = setting(
        8,
        "trajectories in one supervised step; the stage starts once this many are there",
        metavar="N",
        ge=1,
    )
    supervised_learning_rate: float = setting(
        2e-5,
        "AdamW learning rate of the supervised steps (GRPO's is --learning-rate); not "
        "measured yet on a real model",
        gt=0.0,
    )

    # -- how the trainer computes ---------------------------------------------------------
    precision: Literal["auto", "float32", "bfloat16", "autocast"] = setting(
        "auto",
        "what the trainer computes in: bfloat16 (float32 master weights and AdamW state, "
        "bf16 checkpoints), float32, autocast (float32 weights, bf16 matmuls); auto: "
        "bfloat16 when every replica serves bfloat16, else float32",
    )
    micro_batch_tokens: int = setting(
        8192, "tokens in one forward/backward pass", metavar="N", ge=1
    )
    logprob_chunk_tokens: int = setting(
        512,
        "trained positions whose logprobs go through the LM head at once ([chunk, vocab] float32)",
        metavar="N",
        ge=1,
    )
    activation_checkpointing: bool = setting(
        False,
        "recompute decoder layer activations in the backward pass: less memory for about a "
        "third more compute",
    )
    torch_threads: int = setting(
        0,
        "torch's threads for training; 0: half the cores where a vLLM replica serves from "
        "this host and the trainer computes on the CPU (learner/threads.py), every core while "
        "a step computes with the replicas paused (--time-slice), else torch's default, one "
        "per core. A GRPO step of SmolLM2 beside one busy core took 15.0 s on 1 "
        "thread and 25.8 s on 2",
        metavar="N",
        ge=0,
    )
    time_slice: Literal["auto", "off"] = setting(
        "auto",
        "auto: where the trainer computes on the CPU of a host whose vLLM replicas serve, it "
        "pauses them (requests kept, resumed after, 60 s at most) while it computes a step, "
        "on every core or --torch-threads: steps several times as often, and the clients "
        "wait out each step's compute (docs/learner/run.md); off: it computes beside them",
    )
    optimizer_state_every: int = setting(
        10,
        "write the optimizer state (AdamW moments, bf16's float32 master weights: 12 bytes a "
        "parameter) beside every N-th step's checkpoint, and the serving one's at a clean "
        "stop; a checkpoint without one trains on with the moments started afresh. 1: every "
        "step; 0: only at a clean stop",
        metavar="N",
        ge=0,
    )
    max_sequence_mismatch: float = setting(
        1.0,
        "a sequence whose recorded (vLLM) and recomputed logprobs disagree by more than this "
        "(mean k3 estimate of KL per trained token, the scale of the mismatch_kl metric) is "
        "left out of the step",
        gt=0.0,
    )

    # -- LoRA -----------------------------------------------------------------------------
    lora: bool = setting(
        False,
        "train a LoRA adapter instead of all weights; vLLM must run with --enable-lora "
        "--max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1",
    )
    tenants: bool = setting(
        False,
        "train each tenant's own adapter on its own traffic alone (tenants: the admin API, "
        "docs/tenants.md), the tenants in turn; needs --lora; the shared policy is not trained",
    )
    lora_rank: int = setting(16, "adapter rank, at most vLLM's --max-lora-rank", ge=1)
    lora_alpha: float = setting(32.0, "adapter scaling alpha", gt=0.0)
    lora_targets: Annotated[list[str], NoDecode] = setting(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        help="the modules that get an adapter",
        metavar="NAME,NAME",
    )
    lora_load_from: Literal["auto", "memory", "disk"] = setting(
        "auto",
        "where vLLM loads each adapter version from: memory (a copy in /dev/shm, so a publish "
        "never waits on the disk; the replicas must see this machine's /dev/shm: the same "
        "host, or containers with ipc: host), disk (the checkpoint directory), auto: memory "
        "where /dev/shm is writable, and the disk from the first replica that cannot read "
        "it. The checkpoint is written to the disk either way (rollbacks, restores, resumes)",
    )

    # -- swaps ----------------------------------------------------------------------------
    verify_tolerance: float | None = setting(
        None,
        "max |vLLM - trainer| probe logprob after a swap (default: by the dtype vLLM serves: "
        "float32 1e-3, bfloat16 and float16 1e-2; where the weights were compared exactly "
        "and matched, float32 1e-2 and half precision 1.0)",
        gt=0.0,
    )
    transport: Literal["auto", "disk", "transfer"] = setting(
        "auto",
        "how full weights reach the replicas: disk (a checkpoint each replica reloads), "
        "transfer (vLLM's weight-transfer API from shared memory, without the disk; the "
        "replicas run on this machine with --weight-transfer-config "
        '\'{"backend": "onthejob_shm"}\'), auto: transfer where every replica supports '
        "it, else disk. LoRA runs load adapters. The checkpoint is written either way",
    )
    transfer_delta: bool = setting(
        False,
        "a transfer writes only the weights that changed since the replica's version (a "
        "full sync after a restore, and at the first swap). Off by default: into shared "
        "memory, finding the changed elements costs more than copying all of them "
        "(bench/swap_transport.py: 0.32 s against 0.06 s for SmolLM2)",
    )
    swap_drain_timeout: float = setting(
        60.0,
        "seconds a swap waits for the replicas' traffic to drain before it aborts what is left",
        metavar="SECONDS",
        ge=0.0,
    )

    # -- canaries (docs/tenants.md) -------------------------------------------------------
    canary_share: float = setting(
        0.0,
        "each new verified version first serves this share of its scope's sessions (a "
        "tenant's, or the shared policy's) as a canary beside the version that serves the "
        "rest, and the scope trains no step until the canary promotes it or rolls it back: "
        "an adapter (--lora), or full weights on some of two or more --upstream replicas; "
        "full weights on one replica serve at once, as with 0: off. A tenant's own setting "
        "(PUT /admin/api/tenants/NAME/canary) overrides it",
        metavar="SHARE",
        ge=0.0,
        lt=1.0,
    )
    canary_min_calls: int = setting(
        100, "calls each arm of the learner's canary needs before any decision", metavar="N", ge=1
    )
    canary_time_limit: float = setting(
        24 * 3600.0,
        "seconds the learner's canary runs at most; then its default decision",
        metavar="SECONDS",
        gt=0.0,
    )
    canary_default: Literal["promote", "rollback"] = setting(
        "rollback",
        "the learner's canary's decision at its time limit, when the test has not decided "
        "(a promotion the reward-hacking watch holds is rolled back)",
    )

    # -- reporting ------------------------------------------------------------------------
    report_to: Annotated[list[str], NoDecode] = setting(
        default_factory=list,
        help="also report each step's metrics to these trackers (comma-separated: "
        "tensorboard, wandb, mlflow; none by default). Their packages come with "
        "`pip install 'onthejob[trackers]'`; W&B runs offline unless WANDB_MODE says otherwise",
        metavar="NAME,NAME",
    )
    report_dir: Path = setting(
        Path("onthejob-runs"),
        "where the trackers write: TensorBoard's event files, W&B's runs, MLflow's file store",
        metavar="DIR",
    )
    run_name: str | None = setting(
        None, "the run's name in the trackers (default: learn-YYYYMMDD-HHMMSS)", metavar="NAME"
    )

    @field_validator(
        "upstreams", "graders", "keys", "lora_targets", "report_to", "signal_weights", mode="before"
    )
    @classmethod
    def _split(cls, value: object) -> object:
        # the environment gives a comma-separated list; a TOML file and flags give a list
        return comma_list(value) if isinstance(value, str) else value

    @property
    def turn_credit(self) -> bool:
        """Whether steps train each reply on its own next-turn signal (`credit`)."""
        if self.credit == "auto":
            kinds = {spec.split(":")[0].split("@")[0].strip() for spec in self.graders}
            return kinds == {"next_turn"}
        return self.credit == "turn"

    @model_validator(mode="after")
    def _tenants_train_adapters(self) -> LearnerConfig:
        if self.tenants and not self.lora:
            raise ValueError("--tenants trains each tenant's LoRA adapter: it needs --lora")
        return self

    @model_validator(mode="after")
    def _supervised_stage_of_the_shared_policy(self) -> LearnerConfig:
        if self.tenants and self.supervised_steps:
            raise ValueError("--supervised-steps trains the shared policy: not with --tenants")
        return self

    @model_validator(mode="after")
    def _a_control_run_shuffles_what_trains(self) -> LearnerConfig:
        if self.turn_credit and self.shuffle_rewards:
            raise ValueError(
                "--shuffle-rewards permutes trajectory rewards, but with --credit turn each "
                "reply trains on its own signal: no control; use --credit trajectory"
            )
        return self

    @field_validator("signal_weights")
    @classmethod
    def _weights_parse(cls, value: list[str]) -> list[str]:
        from learner.signals import SignalWeights

        SignalWeights.parse(value)  # a ValueError names the bad entry
        return value

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, value: list[str]) -> list[str]:
        names = [v.strip().lower() for v in value if v.strip() and v.strip().lower() != "none"]
        unknown = sorted(set(names) - set(TRACKERS))
        if unknown:
            raise ValueError(f"unknown tracker {', '.join(unknown)} (known: {', '.join(TRACKERS)})")
        return list(dict.fromkeys(names))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file = _CONFIG_FILE.get()
        if file is None:
            return init_settings, env_settings
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, file)

    @classmethod
    def load(cls, *, config_file: Path | None, overrides: dict[str, Any]) -> LearnerConfig:
        """Defaults < ``config_file`` < environment < ``overrides`` (None: not given).
        ValueError with every problem, each named by its setting."""
        if config_file is not None and not config_file.is_file():
            raise ValueError(f"--config {config_file}: no such file")
        token = _CONFIG_FILE.set(config_file)
        try:
            config = cls(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            raise ValueError(_problems(exc, config_file)) from None
        finally:
            _CONFIG_FILE.reset(token)
        if not config.model:
            raise ValueError("--model is required: the base model directory vLLM serves")
        if config.rubrics:
            from learner.graders.rubrics import Rubrics

            Rubrics.load(config.rubrics)  # a mistake stops the start, not every grading
        return config


def _problems(exc: ValidationError, config_file: Path | None) -> str:
    """'name: what is wrong' for each problem, as a person reads them."""
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        if error["type"] == "extra_forbidden":
            where = f" in {config_file}" if config_file else ""
            lines.append(f"unknown setting {name}{where}")
        else:
            lines.append(f"{name}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)
