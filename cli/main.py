"""The `onthejob` command line: the top-level parser and the command groups it is made of.

Each group is a module whose ``register(commands)`` adds its sub-commands; the proxy's live
in `proxy/commands/`, the learner's in the learner package. They import what their commands
run only when one runs (torch, vLLM's client), so building the parser stays quick.
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType

import learner.commands
import learner.demo.cli
import learner.models_cli
import learner.rollout.cli
import proxy.commands.db
import proxy.commands.export
import proxy.commands.serve
import proxy.commands.spool

COMMAND_GROUPS: tuple[ModuleType, ...] = (
    proxy.commands.serve,  # serve
    proxy.commands.db,  # db upgrade | current
    proxy.commands.export,  # export
    proxy.commands.spool,  # spool replay
    learner.commands,  # learn, rollback, regrade
    learner.demo.cli,  # demo
    learner.rollout.cli,  # rollout, eval-report, tasks
    learner.models_cli,  # models prepare | list
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
