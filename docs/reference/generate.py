"""Write the reference pages generated from the code: `make docs`.

- cli.md: every command's `--help`, as `onthejob` prints it;
- configuration.md: every setting of the proxy (proxy/settings.py), of the learner
  (learner/config.py), of the demo (learner/demo/settings.py), of rollouts
  (learner/rollout/settings.py) and of the smaller commands (learner/command_settings.py,
  proxy/command_settings.py), with its environment variable, flag, default and help text.

`tests/unit/test_reference_docs.py` fails when a page differs from what this writes, so a
setting or flag cannot exist in the code without its line here, nor the other way round.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WIDTH = "100"  # argparse wraps help at $COLUMNS

CONFIGURATION_INTRO = """\
# Configuration

Generated from `proxy/settings.py`, `learner/config.py`, `learner/demo/settings.py`,
`learner/rollout/settings.py`, `learner/command_settings.py` and `proxy/command_settings.py` by
`make docs`; do not edit the tables by hand. The flags as the commands print them:
[cli.md](cli.md). In the compose deployment every setting goes in `.env` (`.env.example` lists
them all): see [Deployment](../operations.md#deployment).

## The database and the schema

The database comes from `--db`, else `ONTHEJOB_DATABASE_URL`, else `sqlite:///onthejob.db` in
the working directory (for `onthejob rollout`: else the proxy's own). PostgreSQL URLs
(`postgresql://user@host/db`) use psycopg 3.

Only `onthejob db upgrade`, or a command started with `--migrate`, changes the schema: the
proxy, the learner, `regrade`, `rollout` and `tasks load` all refuse a schema that is behind
(or ahead of) their code, and say what to run, so a newer learner never migrates the
database under older proxies. The one exception is a new SQLite file, never migrated: it gets
its schema at start (the zero-set-up default; for the proxy not with
`ONTHEJOB_AUTO_MIGRATE=false`). If the proxy cannot reach the database at start, the schema is
checked before the first write, and calls wait in the call log until it is current; so do
calls written after the schema was taken back under a running proxy (a table or column
missing is not a refusal: nothing goes to `<spool>.rejected` for it).
"""

PROXY_INTRO = """\
## The proxy (`onthejob serve`)

Flags over `ONTHEJOB_<NAME>` environment variables over the defaults. Lists come from the
environment comma-separated (`ONTHEJOB_UPSTREAMS=http://a:8000,http://b:8000`). Secrets have
no flag: a flag would show them in the process list.
"""

LEARNER_INTRO = """\
## The learner (`onthejob learn`)

Flags over `ONTHEJOB_LEARN_<NAME>` environment variables over a TOML file (`--config FILE`,
whose keys are the setting names below) over the defaults. Lists come from the environment
comma-separated, from the TOML file as arrays. The live knobs and which value wins:
[the learner](../learner.md).
"""


def settings_table(settings: type) -> str:
    from store.settings_fields import shown_default

    lines = [
        "| setting | environment | flag | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for name, info in settings.model_fields.items():  # type: ignore[attr-defined]
        env, flag = _env_and_flag(settings, name, info)
        default = shown_default(info)
        help_text = (info.description or "").replace("|", "\\|")
        lines.append(
            f"| `{name}` | {env} | {flag} | "
            f"{f'`{default}`' if default is not None else ''} | {help_text} |"
        )
    return "\n".join(lines) + "\n"


def _env_and_flag(settings: type, name: str, info: Any) -> tuple[str, str]:
    """The environment and flag columns; an argument is always typed, so it has no variable."""
    from store.settings_fields import argument_name, cli_extra, env_name, flag_name

    argument = argument_name(name, info)
    if argument is not None:
        return "(none)", f"`{argument}` (argument)"
    flag, short = flag_name(name, info), cli_extra(info).get("short")
    shown = f"`{flag}`, `{short}`" if flag and short else f"`{flag}`" if flag else "(none)"
    return f"`{env_name(settings, name)}`", shown


DEMO_INTRO = """\
## The demo (`onthejob demo`)

Flags over `ONTHEJOB_DEMO_<NAME>` environment variables over the defaults. The demo starts
vLLM, the proxy and the learner itself, with settings of its own recipe: [the demo](../demo.md).
"""

ROLLOUT_INTRO = """\
## Rollouts (`onthejob rollout`)

Flags over `ONTHEJOB_ROLLOUT_<NAME>` environment variables over the defaults. The harness
command comes after `--`: [rollouts](../rollouts.md).
"""


VERSIONS_INTRO = """\
## Rollback and pinning (`onthejob rollback`, `onthejob pin`, `onthejob unpin`)

The version is an argument. The database and the upstreams are the learner's settings
(`--db`, `--upstream`, above). `onthejob rollback`:
"""

PIN_INTRO = """\
`onthejob pin` and `onthejob unpin`:
"""

REGRADE_INTRO = """\
## Regrading (`onthejob regrade`)

Which trajectories to grade again: flags over `ONTHEJOB_REGRADE_<NAME>` environment variables
over the defaults; a trajectory matches every filter given. The graders, the database and
`--config FILE` are the learner's settings, above.
"""

EXPORT_INTRO = """\
## Export (`onthejob export`)

Flags over `ONTHEJOB_EXPORT_<NAME>` environment variables over the defaults. The formats:
[the export format](export-format.md).
"""

SPOOL_INTRO = """\
## Replaying refused rows (`onthejob spool replay`)

Flags over `ONTHEJOB_SPOOL_<NAME>` environment variables over the defaults:
`ONTHEJOB_SPOOL_PATH` is the proxy's own `--spool` too.
"""

MODELS_INTRO = """\
## Real models (`onthejob models prepare NAME`, `onthejob models list`)

Flags over `ONTHEJOB_MODEL_<NAME>` environment variables over the defaults; `models list`
takes `--cache` only.
"""


def configuration_page() -> str:
    from learner.command_settings import (
        ModelPrepareSettings,
        PinSettings,
        RegradeSettings,
        RollbackSettings,
    )
    from learner.config import LearnerConfig
    from learner.demo.settings import DemoSettings
    from learner.rollout.settings import RolloutSettings
    from proxy.command_settings import ExportSettings, SpoolReplaySettings
    from proxy.settings import Settings

    return "\n".join(
        [
            CONFIGURATION_INTRO,
            PROXY_INTRO,
            settings_table(Settings),
            LEARNER_INTRO,
            settings_table(LearnerConfig),
            DEMO_INTRO,
            settings_table(DemoSettings),
            ROLLOUT_INTRO,
            settings_table(RolloutSettings),
            VERSIONS_INTRO,
            settings_table(RollbackSettings),
            PIN_INTRO,
            settings_table(PinSettings),
            REGRADE_INTRO,
            settings_table(RegradeSettings),
            EXPORT_INTRO,
            settings_table(ExportSettings),
            SPOOL_INTRO,
            settings_table(SpoolReplaySettings),
            MODELS_INTRO,
            settings_table(ModelPrepareSettings),
        ]
    )


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """(full command, parser) for every command under ``parser``, depth first."""
    found = []
    for action in parser._actions:  # argparse keeps its sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((name, sub))
                found += [(f"{name} {deeper}", p) for deeper, p in _subcommands(sub)]
    return found


def cli_page() -> str:
    from cli.main import build_parser

    parser = build_parser()
    parts = [
        "# Command line\n",
        "Generated from the code by `make docs`: what `onthejob COMMAND --help` prints. The "
        "settings behind the flags, with their environment variables: "
        "[configuration.md](configuration.md).\n",
        "```",
        parser.format_help().rstrip(),
        "```",
    ]
    for name, sub in _subcommands(parser):
        if any(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)):
            continue  # a group (`db`, `tasks`): its commands follow
        parts += [f"\n## onthejob {name}\n", "```", sub.format_help().rstrip(), "```"]
    return "\n".join(parts) + "\n"


def pages() -> dict[Path, str]:
    os.environ["COLUMNS"] = WIDTH
    return {HERE / "cli.md": cli_page(), HERE / "configuration.md": configuration_page()}


def main() -> int:
    for path, text in pages().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
