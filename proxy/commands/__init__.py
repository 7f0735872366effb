"""The `onthejob` sub-commands that belong to the proxy, and what every command shares.

Each command group is a module with ``register(commands)``, which adds its sub-parsers to
`onthejob`'s; `cli.main` lists the groups (the learner's live in the learner package).
Parsers are built without importing anything heavy: a command imports what it needs when
it runs, so `onthejob serve --help` starts in a blink and the proxy runs without torch.
"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from proxy.settings import Settings
from store.settings_cli import given
from store.url import add_db

__all__ = ["add_db", "proxy_settings"]


def proxy_settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the flags given (None = not given):
    `serve`'s flags are the settings' own, other commands take only `--db`."""
    values = given(args, Settings)
    if getattr(args, "db", None):
        values["database_url"] = args.db
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise SystemExit(f"onthejob {args.command}: {problems}") from None
