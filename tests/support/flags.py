"""A command's flags against its settings class: one flag per setting (a bool's --no-NAME
too) and none other, and no secret given a flag. The reference-page tests check every
command with it, and a command's own tests (the demo's) theirs."""

from __future__ import annotations

import argparse

from store.settings_fields import argument_name, flag_name

# settings read from the environment or a file only: a flag would show them to everyone who
# can list processes
SECRETS = {"upstream_api_key", "feedback_token", "admin_token", "teacher_api_key"}


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }


def flags_from(settings: type, only: set[str] | None = None) -> set[str]:
    """The flags a settings class gives (a bool setting also takes --no-NAME)."""
    fields = {n: i for n, i in settings.model_fields.items() if only is None or n in only}
    flags = {str(flag_name(n, i)) for n, i in fields.items() if flag_name(n, i)}
    negated = {
        "--no-" + str(flag_name(n, i)).removeprefix("--")
        for n, i in fields.items()
        if i.annotation is bool and flag_name(n, i)
    }
    return flags | negated


def check_flags(parser: argparse.ArgumentParser, settings: type, extra: set[str]) -> None:
    """Every setting of ``settings`` has its flag and every flag (but ``extra``) is a
    setting; a setting without a flag or an argument is a secret."""
    assert flags_of(parser) == flags_from(settings) | extra
    unflagged = {
        n
        for n, i in settings.model_fields.items()
        if flag_name(n, i) is None and argument_name(n, i) is None
    }
    assert unflagged <= SECRETS
