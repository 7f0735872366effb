"""The `onthejob` command line: the top-level parser and the command groups it is made of.

Each group is a module of this package whose ``register(commands)`` adds its sub-commands,
their flags generated from the settings (cli/flags.py). They import what their commands run
only when one runs (torch, vLLM's client), so building the parser stays quick and `serve`
runs without the learner's dependencies.
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType

import cli.db
import cli.demo
import cli.export
import cli.learn
import cli.models
import cli.rollout
import cli.serve
import cli.spool

COMMAND_GROUPS: tuple[ModuleType, ...] = (
    cli.serve,  # serve
    cli.db,  # db upgrade | current
    cli.export,  # export
    cli.spool,  # spool replay
    cli.learn,  # learn, rollback, regrade
    cli.demo,  # demo
    cli.rollout,  # rollout, eval-report, tasks
    cli.models,  # models prepare | list
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onthejob",
        description="Learning on the job: a recording proxy in front of vLLM that post-trains "
        "the served model from its own traffic.",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning (default info)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
