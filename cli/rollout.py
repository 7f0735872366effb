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

from cli.flags import add_db, add_flags, given
from learner.command_settings import TasksLoadSettings
from learner.rollout.settings import CURRICULUM_ONLY, RolloutSettings
from store.schema import SchemaBehind
from store.url import database_url, given_database_url


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
    add_db(load)
    add_flags(load, TasksLoadSettings)
    load.set_defaults(func=cmd_tasks_load)
    listing = actions.add_parser("list", help="list the task table")
    add_db(listing)
    listing.set_defaults(func=cmd_tasks_list)


def _add_rollout(commands: Any) -> None:
    rollout = commands.add_parser(
        "rollout",
        help="run a harness command G times per task through the proxy and grade the runs",
        description="Run COMMAND (a black-box harness) group-size times per task, each in a "
        "fresh working directory, with OPENAI_BASE_URL / OPENAI_API_BASE / ANTHROPIC_BASE_URL "
        "pointing at the proxy under a session key of its own; the prompt is `{prompt}` in "
        "ARGS, on stdin and in ONTHEJOB_PROMPT. Each run is graded (the task's check command, "
        "its grader, --grader, or its reference answer) and the learner trains on the groups; "
        "with --eval, success per task is stored instead. Ctrl-C stops cleanly. Every flag can "
        "also be set as ONTHEJOB_ROLLOUT_<NAME>.",
        usage="onthejob rollout --proxy URL (--tasks FILE | --curriculum FILE) [options] "
        "-- COMMAND [ARGS...]",
    )
    add_flags(rollout, RolloutSettings)
    rollout.add_argument("harness", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS")
    rollout.set_defaults(func=cmd_rollout)


def rollout_settings(args: argparse.Namespace) -> RolloutSettings:
    """The settings the flags typed (and the environment) ask for, checked together."""
    try:
        settings = RolloutSettings(**given(args, RolloutSettings))
    except ValueError as exc:
        raise SystemExit(f"onthejob rollout: {exc}") from exc
    if settings.proxy is None:
        raise SystemExit("onthejob rollout: --proxy URL is required")
    if (settings.tasks is None) == (settings.curriculum is None):
        raise SystemExit("onthejob rollout: give one of --tasks FILE and --curriculum FILE")
    if settings.curriculum is None:
        for name, unset in CURRICULUM_ONLY.items():
            if getattr(settings, name) != unset:
                raise SystemExit(f"onthejob rollout: --{name.replace('_', '-')} needs --curriculum")
    else:
        # a curriculum's stages name their task sets, and it trains until they promote
        for option, typed in (
            ("--eval", settings.eval),
            ("--name", settings.name),
            ("--epochs", settings.epochs != 1),
        ):
            if typed:
                raise SystemExit(f"onthejob rollout: {option} does not go with --curriculum")
    return settings


def rollout_config(settings: RolloutSettings, command: list[str], tasks: Any) -> Any:
    """The RolloutConfig of the settings, for one task set (a curriculum's: its first stage's,
    each stage then its own); a grader SPEC that does not parse stops here."""
    from learner.rollout.runner import RolloutConfig

    assert settings.proxy is not None
    if settings.grader:
        from learner.graders.combine import parse_spec

        parse_spec(settings.grader)
    return RolloutConfig(
        proxy_url=settings.proxy,
        command=command,
        tasks=tasks,
        # none given: the store the proxy says it records to (learner/rollout/proxy_store)
        database_url=given_database_url(settings.database_url),
        group_size=settings.group_size,
        concurrency=settings.concurrency,
        epochs=settings.epochs,
        timeout=settings.timeout,
        eval=settings.eval,
        grader=settings.grader,
        failure_reward=settings.failure_reward,
        success_threshold=settings.success_threshold,
        check_timeout=settings.check_timeout,
        keep_workdirs=settings.keep_workdirs,
        migrate=settings.migrate,
    )


def cmd_rollout(args: argparse.Namespace) -> int:
    from learner.rollout.progress import ProgressBar
    from learner.rollout.proxy_store import StoreMismatch
    from learner.rollout.report import format_table
    from learner.rollout.runner import NO_CALLS, run_rollout
    from learner.rollout.taskset import load_task_set
    from store.tasks import TaskTableError

    command = args.harness[1:] if args.harness[:1] == ["--"] else args.harness
    settings = rollout_settings(args)
    if settings.curriculum is not None:
        return cmd_curriculum(settings, command)
    assert settings.tasks is not None and settings.proxy is not None
    try:
        task_set = load_task_set(settings.tasks, name=settings.name)
        config = rollout_config(settings, command, task_set)
    except (TaskTableError, ValueError) as exc:
        raise SystemExit(f"onthejob rollout: {exc}") from exc
    label = "eval" if settings.eval else "rollout"
    bar = ProgressBar(label, disable=not settings.progress)
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


def cmd_curriculum(settings: RolloutSettings, command: list[str]) -> int:
    from learner.rollout.curriculum import CurriculumError, load_curriculum
    from learner.rollout.curriculum_runner import (
        CurriculumConfig,
        CurriculumFailed,
        run_curriculum,
    )
    from learner.rollout.proxy_store import StoreMismatch
    from store.tasks import TaskTableError

    assert settings.curriculum is not None and settings.proxy is not None
    try:
        curriculum = load_curriculum(settings.curriculum)
        missing = [s.name for s in curriculum.stages if s.command is None]
        if missing and not command:
            raise SystemExit(
                f"onthejob rollout: stage {missing[0]!r} of {settings.curriculum} has no command: "
                "give one after `--`, or `command` in the stage"
            )
        config = CurriculumConfig(
            curriculum=curriculum,
            rollout=rollout_config(
                settings,
                command or list(curriculum.stages[0].command or []),
                curriculum.stages[0].tasks,
            ),
            max_rounds=settings.max_rounds,
            minutes=settings.minutes,
            step_wait=settings.step_wait,
            progress=settings.progress,
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
        schema.require(url, migrate=bool(args.migrate), who="`tasks load`")
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
