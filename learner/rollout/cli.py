"""Sub-commands `rollout`, `eval-report` and `tasks load|list`, hooked into `onthejob`.

Kept light: everything heavy is imported when a command runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from store.schema import SchemaBehind
from store.url import add_db, database_url, given_database_url


@contextlib.contextmanager
def _reading(args: argparse.Namespace, command: str) -> Iterator[Any]:
    """A connection for a read-only command; a database it cannot read is a clear error."""
    from sqlalchemy.exc import SQLAlchemyError

    from store import db

    engine = db.make_engine(database_url(args.db))
    try:
        with engine.connect() as conn:
            yield conn
    except SQLAlchemyError as exc:
        reason = str(exc.orig if getattr(exc, "orig", None) else exc).splitlines()[0]
        raise SystemExit(
            f"onthejob {command}: cannot read the database ({reason}); "
            "is its schema current (`onthejob db upgrade`)?"
        ) from None
    finally:
        engine.dispose()


def _reward(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None


def register(commands: Any) -> None:
    """Register the sub-commands on `onthejob`'s sub-parsers."""
    _add_rollout(commands)
    report = commands.add_parser(
        "eval-report",
        help="print eval success per policy version and task set",
        description="Mean reward, pass@1 and pass@k of every policy version on every task "
        "set evaluated with `onthejob rollout --eval`, oldest version first.",
    )
    add_db(report)
    report.set_defaults(func=cmd_eval_report)
    tasks = commands.add_parser("tasks", help="the task table (task sets for rollouts)")
    actions = tasks.add_subparsers(dest="tasks_command", required=True, metavar="ACTION")
    load = actions.add_parser("load", help="validate a JSONL task set and load it")
    load.add_argument("file", metavar="FILE")
    add_db(load)
    _add_migrate(load)
    load.set_defaults(func=cmd_tasks_load)
    listing = actions.add_parser("list", help="list the task table")
    add_db(listing)
    listing.set_defaults(func=cmd_tasks_list)


def _add_migrate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--migrate",
        action="store_true",
        help="upgrade the database schema first; without it a schema that is behind stops "
        "the command with what to run (`onthejob db upgrade`)",
    )


def _add_rollout(commands: Any) -> None:
    rollout = commands.add_parser(
        "rollout",
        help="run a harness command G times per task through the proxy and grade the runs",
        description="Run COMMAND (a black-box harness) group-size times per task, each in a "
        "fresh working directory, with OPENAI_BASE_URL / OPENAI_API_BASE / ANTHROPIC_BASE_URL "
        "pointing at the proxy under a session key of its own; the prompt is `{prompt}` in "
        "ARGS, on stdin and in ONTHEJOB_PROMPT. Each run is graded (the task's check command, "
        "its grader, --grader, or its reference answer) and the learner trains on the groups; "
        "with --eval, success per task is stored instead. Ctrl-C stops cleanly.",
        usage="onthejob rollout --proxy URL (--tasks FILE | --curriculum FILE) [options] "
        "-- COMMAND [ARGS...]",
    )
    rollout.add_argument("--proxy", required=True, metavar="URL", help="the onthejob proxy")
    what = rollout.add_mutually_exclusive_group(required=True)
    what.add_argument("--tasks", metavar="FILE", help="task set (JSONL)")
    what.add_argument(
        "--curriculum",
        metavar="FILE",
        help="a curriculum (TOML): its stages in order, each trained on and evaluated until "
        "its promotion rule holds; resumes at the stage recorded in the store",
    )
    rollout.add_argument("--name", help="task set name for eval results (default: file stem)")
    rollout.add_argument("--group-size", type=int, default=4, metavar="G", help="default 4")
    rollout.add_argument("--concurrency", type=int, default=4, metavar="C", help="default 4")
    rollout.add_argument("--epochs", type=int, default=1, metavar="E", help="default 1")
    rollout.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="per run (default 600)"
    )
    rollout.add_argument(
        "--eval", action="store_true", help="no training signal: report success per task"
    )
    rollout.add_argument(
        "--db",
        metavar="URL",
        help="the proxy's database (default: $ONTHEJOB_DATABASE_URL, else the one the proxy "
        "says it records to); a database that is not the proxy's is refused",
    )
    _add_migrate(rollout)
    rollout.add_argument(
        "--grader", metavar="SPEC", help="grader for tasks without check/grader (learner SPEC)"
    )
    rollout.add_argument(
        "--failure-reward",
        type=_reward,
        default=0.0,
        metavar="X",
        help="reward of a run that timed out or exited non-zero (default 0; 'none': no reward)",
    )
    rollout.add_argument(
        "--success-threshold",
        type=float,
        default=1.0,
        metavar="X",
        help="eval: a run succeeds with at least this reward (default 1.0)",
    )
    rollout.add_argument(
        "--check-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="per check command (default 120); a check that takes longer grades nothing",
    )
    rollout.add_argument("--keep-workdirs", action="store_true", help="do not delete run dirs")
    rollout.add_argument(
        "--max-rounds",
        type=int,
        metavar="N",
        help="curriculum: stop after N training rounds (evals due after the last one still run)",
    )
    rollout.add_argument(
        "--minutes", type=float, metavar="M", help="curriculum: start no round or eval after M"
    )
    rollout.add_argument(
        "--step-wait",
        type=float,
        default=0.0,
        metavar="S",
        help="curriculum: after a round with a training signal, wait up to S seconds for the "
        "learner's next version to serve (default 0: do not wait)",
    )
    rollout.add_argument("--no-progress", action="store_true", help="no progress bar")
    rollout.add_argument("harness", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS")
    rollout.set_defaults(func=cmd_rollout)


def cmd_rollout(args: argparse.Namespace) -> int:
    from learner.rollout.progress import ProgressBar
    from learner.rollout.proxy_store import StoreMismatch
    from learner.rollout.report import format_table
    from learner.rollout.runner import NO_CALLS, RolloutConfig, run_rollout
    from learner.rollout.taskset import load_task_set
    from store.tasks import TaskTableError

    command = args.harness[1:] if args.harness[:1] == ["--"] else args.harness
    if args.curriculum is not None:
        return cmd_curriculum(args, command)
    for option in ("max_rounds", "minutes", "step_wait"):
        if getattr(args, option) not in (None, 0.0):
            raise SystemExit(f"onthejob rollout: --{option.replace('_', '-')} needs --curriculum")
    try:
        task_set = load_task_set(args.tasks, name=args.name)
        if args.grader:
            from learner.graders.combine import parse_spec

            parse_spec(args.grader)
        config = RolloutConfig(
            proxy_url=args.proxy,
            command=command,
            tasks=task_set,
            # none given: the store the proxy says it records to (learner/rollout/proxy_store)
            database_url=given_database_url(args.db),
            group_size=args.group_size,
            concurrency=args.concurrency,
            epochs=args.epochs,
            timeout=args.timeout,
            eval=args.eval,
            grader=args.grader,
            failure_reward=args.failure_reward,
            success_threshold=args.success_threshold,
            check_timeout=args.check_timeout,
            keep_workdirs=args.keep_workdirs,
            migrate=args.migrate,
        )
    except (TaskTableError, ValueError) as exc:
        raise SystemExit(f"onthejob rollout: {exc}") from exc
    label = "eval" if args.eval else "rollout"
    bar = ProgressBar(label, disable=args.no_progress)
    stop = threading.Event()
    # SIGTERM stops as cleanly as Ctrl-C: the harnesses run in sessions of their own and
    # would outlive us otherwise
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        summary = run_rollout(config, on_progress=bar.update, stop=stop)
    except (StoreMismatch, SchemaBehind) as exc:
        raise SystemExit(f"onthejob rollout: {exc}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.close()
    ended = len(summary.runs)
    mean = summary.mean_reward
    print(
        f"{label} {summary.rollout_id}: {ended} runs of {len(config.tasks.tasks)} tasks, "
        f"mean reward {'-' if mean is None else f'{mean:.3f}'}"
        + (" (cancelled)" if summary.cancelled else ""),
        file=sys.stderr,
    )
    if summary.eval_rows:
        print(format_table(summary.eval_rows, per_task=True))
    unrecorded = sum(r.error == NO_CALLS for r in summary.runs)
    if unrecorded:
        print(f"onthejob rollout: {unrecorded} runs failed: {NO_CALLS}", file=sys.stderr)
    return 130 if summary.cancelled else 1 if unrecorded else 0


def cmd_curriculum(args: argparse.Namespace, command: list[str]) -> int:
    from learner.rollout.curriculum import CurriculumError, load_curriculum
    from learner.rollout.curriculum_runner import (
        CurriculumConfig,
        CurriculumFailed,
        run_curriculum,
    )
    from learner.rollout.proxy_store import StoreMismatch
    from learner.rollout.runner import RolloutConfig
    from store.tasks import TaskTableError

    for option, given in (
        ("--eval", args.eval),
        ("--name", args.name),
        ("--epochs", args.epochs != 1),
    ):
        if given:
            raise SystemExit(f"onthejob rollout: {option} does not go with --curriculum")
    try:
        curriculum = load_curriculum(args.curriculum)
        missing = [s.name for s in curriculum.stages if s.command is None]
        if missing and not command:
            raise SystemExit(
                f"onthejob rollout: stage {missing[0]!r} of {args.curriculum} has no command: "
                "give one after `--`, or `command` in the stage"
            )
        if args.grader:
            from learner.graders.combine import parse_spec

            parse_spec(args.grader)
        config = CurriculumConfig(
            curriculum=curriculum,
            rollout=RolloutConfig(
                proxy_url=args.proxy,
                command=command or list(curriculum.stages[0].command or []),
                tasks=curriculum.stages[0].tasks,
                database_url=given_database_url(args.db),
                group_size=args.group_size,
                concurrency=args.concurrency,
                timeout=args.timeout,
                grader=args.grader,
                failure_reward=args.failure_reward,
                success_threshold=args.success_threshold,
                check_timeout=args.check_timeout,
                keep_workdirs=args.keep_workdirs,
                migrate=args.migrate,
            ),
            max_rounds=args.max_rounds,
            minutes=args.minutes,
            step_wait=args.step_wait,
            progress=not args.no_progress,
        )
    except (CurriculumError, TaskTableError, ValueError) as exc:
        raise SystemExit(f"onthejob rollout: {exc}") from exc
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        summary = run_curriculum(config, stop=stop)
    except (StoreMismatch, SchemaBehind, CurriculumError, CurriculumFailed) as exc:
        raise SystemExit(f"onthejob rollout: {exc}") from None
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 130 if summary.cancelled else 0


def cmd_eval_report(args: argparse.Namespace) -> int:
    from learner.rollout.report import by_version_and_set, format_table
    from store import policy_versions, rollouts

    with _reading(args, "eval-report") as conn:
        results = rollouts.eval_results(conn)
        order = policy_versions.version_ordinals(conn)
    if not results:
        print("no eval results yet: run `onthejob rollout --eval ...`", file=sys.stderr)
        return 1
    print(format_table(by_version_and_set(results, order=order)))
    return 0


def cmd_tasks_load(args: argparse.Namespace) -> int:
    from learner.rollout.taskset import load_task_set, store_tasks
    from store import db, schema
    from store.tasks import TaskTableError

    try:
        task_set = load_task_set(args.file)
    except TaskTableError as exc:
        raise SystemExit(f"onthejob tasks load: {exc}") from exc
    url = database_url(args.db)
    try:
        schema.require(url, migrate=args.migrate, who="`tasks load`")
    except schema.SchemaBehind as exc:
        raise SystemExit(f"onthejob tasks load: {exc}") from None
    engine = db.make_engine(url)
    try:
        with engine.begin() as conn:
            count = store_tasks(conn, task_set)
    finally:
        engine.dispose()
    print(f"loaded {count} tasks from {args.file}")
    return 0


def cmd_tasks_list(args: argparse.Namespace) -> int:
    from store.tasks import list_tasks

    with _reading(args, "tasks list") as conn:
        rows = list_tasks(conn)
    for row in rows:
        how = [name for name in ("answer", "grader", "setup", "check") if row.get(name)]
        prompt = (row["prompt"] or "").replace("\n", " ")
        print(f"{row['key']}\t{','.join(how) or '-'}\t{prompt[:60]}")
    return 0
