"""`onthejob learn`, `onthejob rollback`, `onthejob pin|unpin` and `onthejob regrade`: the
learner's own commands (settings: learner/config.py and learner/command_settings.py)."""

from __future__ import annotations

import argparse
import faulthandler
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.flags import add_flags, given, settings_from
from learner.command_settings import (
    ConfigFileSettings,
    PinSettings,
    RegradeSettings,
    RollbackSettings,
)
from store.schema import SchemaBehind

if TYPE_CHECKING:
    from store.publish_lease import LeaseHolder


def register(commands: Any) -> None:
    _add_learn(commands)
    rollback = commands.add_parser(
        "rollback",
        help="serve an earlier policy version again",
        description="Serve VERSION's weights again, as a new version VERSION+rollback-N: "
        "hot-swapped into every upstream behind the swap fence and verified against the "
        "probe VERSION passed when it was published. Waits for a publish in progress (up to "
        "65 s: the lease of a learner killed mid-publish runs out in 60), saying whose.",
    )
    add_flags(rollback, RollbackSettings)
    _add_settings(rollback, only=("database_url", "upstreams"))
    rollback.set_defaults(func=cmd_rollback)
    for name, verb in (("pin", "keep"), ("unpin", "no longer keep")):
        pin = commands.add_parser(
            name, help=f"{verb} a policy version's checkpoint whatever retention would delete"
        )
        add_flags(pin, PinSettings)
        _add_settings(pin, only=("database_url",))
        pin.set_defaults(func=cmd_pin, pinned=name == "pin")
    _add_regrade(commands)


def _add_settings(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """The learner's settings as flags (generated from learner/config.py, all or ``only``)."""
    from learner.config import LearnerConfig

    add_flags(parser, LearnerConfig, only=only)


def _add_learn(commands: Any) -> None:
    learn = commands.add_parser(
        "learn",
        help="run the learner: grade trajectories, GRPO on their tokens, hot-swap into vLLM",
        description="Run the learner until stopped (or --max-steps). Settings: defaults < "
        "--config TOML file (keys: the settings' names, e.g. learning_rate) < "
        "ONTHEJOB_LEARN_<NAME> environment < flags. Every flag below is one setting "
        "(docs/reference/configuration.md).",
    )
    add_flags(learn, ConfigFileSettings)
    _add_settings(learn)
    learn.set_defaults(func=cmd_learn)


def _add_regrade(commands: Any) -> None:
    regrade = commands.add_parser(
        "regrade",
        help="grade chosen trajectories again now (e.g. those whose grading failed)",
        description="Grade the finished trajectories matching every filter given again, with "
        "the learner's graders, and store the results (a step that trained on one keeps it "
        "as it was). The filters can also be set as ONTHEJOB_REGRADE_<NAME>; the other "
        "settings as for `onthejob learn`.",
    )
    add_flags(regrade, RegradeSettings)
    add_flags(regrade, ConfigFileSettings)
    _add_settings(
        regrade,
        only=(
            *("database_url", "migrate", "upstreams", "graders", "tasks"),
            *("self_judge", "rubrics"),
        ),
    )
    regrade.set_defaults(func=cmd_regrade)


def learner_config(args: argparse.Namespace, **extra: object) -> Any:  # a LearnerConfig
    """The learner's settings: defaults < --config file < environment < the flags given."""
    from learner.config import LearnerConfig

    overrides = {**given(args, LearnerConfig), **extra}
    try:
        return LearnerConfig.load(config_file=getattr(args, "config", None), overrides=overrides)
    except ValueError as exc:
        raise SystemExit(f"onthejob {args.command}: {exc}") from exc


def cmd_learn(args: argparse.Namespace) -> int:
    from learner.loop import Learner

    config = learner_config(args)
    from learner import distributed

    # a crash in native code (torch, gloo, vLLM's libraries) prints every thread's Python
    # stack before the process dies, so that a report says where it was
    faulthandler.enable()
    # under torchrun: rank 0 is the learner, the other ranks train their shards with it
    ranks = distributed.Ranks() if distributed.launched() else None
    if ranks is not None and not ranks.leader:
        distributed.end_rank(ranks.serve())
    try:
        learner = Learner(config, ranks=ranks)
        learner.state.stopping.install()  # SIGTERM/Ctrl-C: never in the middle of a swap
        learner.run()
    except SchemaBehind as exc:
        raise SystemExit(f"onthejob learn: {exc}") from None
    except KeyboardInterrupt:
        print("onthejob learn: stopped", file=sys.stderr)
    finally:
        if ranks is not None:
            ranks.stop()
    if ranks is not None:
        distributed.end_rank(0)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from learner.swap.versions import VersionError, serve_version
    from store import db

    version = settings_from(args, RollbackSettings, command="rollback").version
    config = learner_config(args, model="-")
    engine = db.make_engine(config.database_url)
    try:
        label = serve_version(
            engine,
            config.upstreams,
            version,
            expected_for=_expected_for,
            tolerance=config.verify_tolerance,
            drain_timeout=config.swap_drain_timeout,
            on_lease_wait=_say_lease_wait,
        )
    except VersionError as exc:
        raise SystemExit(f"onthejob rollback: {exc}") from exc
    finally:
        engine.dispose()
    print(f"serving the weights of {version} as {label}")
    return 0


def _say_lease_wait(current: LeaseHolder) -> None:
    until = current["expires_at"].astimezone().strftime("%H:%M:%S")
    print(
        f"onthejob rollback: waiting for the publish lease, held by {current['holder']} "
        f"(a holder that died gives it up at {until} at the latest)",
        file=sys.stderr,
    )


def cmd_pin(args: argparse.Namespace) -> int:
    from store import db, policy_versions

    version = settings_from(args, PinSettings, command=args.command).version
    config = learner_config(args, model="-")
    engine = db.make_engine(config.database_url)
    try:
        with engine.begin() as conn:
            policy_versions.pin(conn, version=version, pinned=args.pinned)
    except policy_versions.VersionError as exc:
        raise SystemExit(f"onthejob {args.command}: {exc}") from exc
    finally:
        engine.dispose()
    print(f"{version} {'pinned' if args.pinned else 'unpinned'}")
    return 0


def _expected_for(checkpoint: Path) -> Any:
    """Only for a version recorded before probes were kept: loads its model (torch)."""
    from learner.loop import expected_for

    return expected_for(checkpoint)


def cmd_regrade(args: argparse.Namespace) -> int:
    from learner.regrade import Selection, regrade

    filters = settings_from(args, RegradeSettings, command="regrade")
    config = learner_config(args, model="-")
    selection = Selection(
        failed_only=filters.failed,
        session_key=filters.session,
        task_key=filters.task,
        since=_time(filters.since, "since"),
        until=_time(filters.until, "until"),
        ids=tuple(filters.trajectory),
    )
    try:
        report = regrade(config, selection)
    except (ValueError, SchemaBehind) as exc:
        raise SystemExit(f"onthejob regrade: {exc}") from exc
    outcome = report.outcome
    print(
        f"regraded {outcome.saved + len(outcome.pending)}: {outcome.rewarded} rewarded, "
        f"{outcome.retrying} to be tried again, {outcome.failed} failed, "
        f"{len(outcome.pending)} waiting for feedback; "
        f"{report.skipped_trained} left as they were (trained on already)"
    )
    return 0


def _time(text: str | None, name: str) -> Any:  # datetime | None
    from datetime import UTC, datetime

    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(f"onthejob regrade: --{name} {text!r} is not an ISO 8601 time") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
