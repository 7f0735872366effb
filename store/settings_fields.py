"""How a setting is declared, once, for every source it comes from: a pydantic-settings field
made with ``setting(default, "what it does")`` keeps its help text and how its flag looks
(``--kebab-name`` unless the field names another; ``short``, ``metavar``, ``repeat``,
``positional``). The command line generates its flags from these (cli/flags.py), the
reference pages their tables (docs/reference/generate.py). Secrets are declared
``cli=False``: a flag would show them to everyone who can list processes. A required field
declared ``positional=True`` is an argument instead (``onthejob rollback VERSION``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

_MISSING: Any = ...


@dataclass(frozen=True)
class FlagParse:
    """``Annotated[T, FlagParse(parse)]``: the flag's text is read by ``parse`` (which raises
    argparse.ArgumentTypeError on a bad one), for a value no plain type reads."""

    parse: Callable[[str], Any]


def command_config(env_prefix: str) -> SettingsConfigDict:
    """A command's settings: read from ``<env_prefix><NAME>``, an unknown key refused, an
    empty variable taken as unset (`NAME=` in a compose .env file), defaults not validated."""
    return SettingsConfigDict(
        env_prefix=env_prefix, extra="forbid", env_ignore_empty=True, validate_default=False
    )


def setting(
    default: Any = _MISSING,
    help: str = "",
    *,
    default_factory: Any = None,
    flag: str | None = None,
    short: str | None = None,
    metavar: str | None = None,
    repeat: bool = False,
    positional: bool = False,
    cli: bool = True,
    **field_kwargs: Any,
) -> Any:
    """A settings field with its help text and how its flag looks.

    ``flag``: the flag's name when not ``--kebab-name``; ``short``: a one-letter alias
    (``-o``); ``repeat``: a list given by repeating the flag (else comma-separated);
    ``positional``: an argument, named by ``metavar`` (else NAME), not a flag;
    ``cli=False``: environment or file only."""
    extra: CliExtra = {
        "flag": flag,
        "short": short,
        "metavar": metavar,
        "repeat": repeat,
        "positional": positional,
        "cli": cli,
    }
    if default_factory is not None:
        return Field(
            default_factory=default_factory,
            description=help,
            json_schema_extra=extra,
            **field_kwargs,
        )
    return Field(default, description=help, json_schema_extra=extra, **field_kwargs)


class CliExtra(TypedDict, total=False):
    """How a settings field's flag looks (`setting`'s arguments, kept in the field)."""

    flag: str | None
    short: str | None
    metavar: str | None
    repeat: bool
    positional: bool
    cli: bool


def cli_extra(info: FieldInfo) -> CliExtra:
    extra = info.json_schema_extra
    return cast(CliExtra, dict(extra)) if isinstance(extra, dict) else {"cli": True}


def flag_name(name: str, info: FieldInfo) -> str | None:
    """The field's flag (None: it has none, or is an argument)."""
    extra = cli_extra(info)
    if not extra.get("cli", True) or extra.get("positional"):
        return None
    return str(extra.get("flag") or "--" + name.replace("_", "-"))


def argument_name(name: str, info: FieldInfo) -> str | None:
    """The name a positional field's argument is shown by (None: it is no argument)."""
    extra = cli_extra(info)
    if not extra.get("positional"):
        return None
    return str(extra.get("metavar") or name.upper())


def shown_default(info: FieldInfo) -> str | None:
    """The default as the help and the reference print it (None: nothing to print)."""
    if info.is_required():
        return None
    value = info.get_default(call_default_factory=True)
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def comma_list(text: str) -> list[str]:
    """``a,b`` -> ["a", "b"] (blanks dropped): how list settings come from a flag or the
    environment."""
    return [part.strip() for part in text.split(",") if part.strip()]


def env_name(settings: type[BaseSettings], name: str) -> str:
    """The environment variable a field is read from (its first alias, else prefix + NAME)."""
    info = settings.model_fields[name]
    alias = info.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return str(choices[0]).upper()
    if isinstance(alias, str):
        return alias.upper()
    prefix = str(settings.model_config.get("env_prefix", ""))
    return (prefix + name).upper()
