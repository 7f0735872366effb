"""Command-line flags generated from pydantic-settings fields, so that a setting is written once.

A field is declared with ``setting(default, "what it does")``; ``add_flags`` gives it a flag
(``--kebab-name`` unless the field names another), typed from its annotation: a bool gets
``--name/--no-name``, a ``Literal`` its choices, a list either a repeatable flag or a
comma-separated value; a field annotated with a ``FlagParse`` is read by its function. Flags
default to None, so ``given`` returns only what was typed:
the settings' own sources (TOML file, environment) fill in the rest. Secrets are declared
``cli=False``: a flag would show them to everyone who can list processes. A required field
declared ``positional=True`` is an argument instead (``onthejob rollback VERSION``), always
typed: no other source fills it in.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar, cast

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

_MISSING: Any = ...
_METAVARS: dict[Any, str] = {int: "N", float: "X", str: "TEXT", Path: "PATH"}
S = TypeVar("S", bound=BaseSettings)


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


class ArgumentOptions(TypedDict, total=False):
    """What `add_argument` is given for a field, besides its names."""

    help: str
    metavar: str
    type: Callable[[str], Any]
    action: type[argparse.Action] | str
    choices: list[str]


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


def add_flags(
    parser: argparse.ArgumentParser,
    settings: type[BaseSettings],
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
) -> None:
    """A flag (or argument) for every field of ``settings`` with one (or those in ``only``),
    in order."""
    chosen = set(only) if only is not None else None
    for name, info in settings.model_fields.items():
        if (chosen is not None and name not in chosen) or name in skip:
            continue
        flag, positional = flag_name(name, info), argument_name(name, info)
        if positional is not None:
            parser.add_argument(name, **_positional(positional, info))
        elif flag is not None:
            short = cli_extra(info).get("short")
            names = (flag, short) if short else (flag,)
            parser.add_argument(*names, dest=name, default=None, **_argument(info))


def given(args: argparse.Namespace, settings: type[BaseSettings]) -> dict[str, Any]:
    """The settings whose flags were typed (their values), by field name."""
    return {
        name: getattr(args, name)
        for name in settings.model_fields
        if getattr(args, name, None) is not None
    }


def settings_from(args: argparse.Namespace, settings: type[S], *, command: str) -> S:
    """``settings`` from the flags typed over its other sources; a value it refuses stops
    ``onthejob COMMAND`` with the reason."""
    try:
        return settings(**given(args, settings))
    except ValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors())
        raise SystemExit(f"onthejob {command}: {problems}") from None


def _problem(error: Any) -> str:  # pydantic's ErrorDetails
    where = ".".join(str(part) for part in error["loc"])
    what = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {what}" if where else what


def _positional(name: str, info: FieldInfo) -> ArgumentOptions:
    argument = _argument(info, metavar=name)
    # always typed, so a default (or the environment) could never apply
    if "action" in argument or not info.is_required():
        raise TypeError(f"argument {name}: a required field of a plain type, or a flag")
    return argument


def _argument(info: FieldInfo, *, metavar: str | None = None) -> ArgumentOptions:
    extra = cli_extra(info)
    kind = _unwrapped(info.annotation)
    help_text = info.description or ""
    default = shown_default(info)
    if default is not None:
        help_text += f" (default {default})"
    argument: ArgumentOptions = {"help": help_text.replace("%", "%%")}
    if metavar or extra.get("metavar"):
        argument["metavar"] = metavar or extra["metavar"]
    origin = typing.get_origin(kind)
    parse = next((m.parse for m in info.metadata if isinstance(m, FlagParse)), None)
    if parse is not None:
        argument["type"] = parse
    elif kind is bool:
        argument["action"] = argparse.BooleanOptionalAction
    elif origin is Literal:
        argument["choices"] = [str(c) for c in typing.get_args(kind)]
    elif origin is list:
        if extra.get("repeat"):
            argument["action"] = "append"
        else:
            argument["type"] = _flag_list
            argument.setdefault("metavar", "A,B")
    elif kind in (int, float, str, Path):
        argument["type"] = kind
        argument.setdefault("metavar", _METAVARS[kind])
    else:  # pragma: no cover - a field type the generator was not taught
        raise TypeError(f"no flag for a setting of type {kind!r}")
    return argument


def _unwrapped(annotation: Any) -> Any:
    """The type inside ``X | None``; any other annotation as it is."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return annotation


def comma_list(text: str) -> list[str]:
    """``a,b`` -> ["a", "b"] (blanks dropped): how list settings come from a flag or the
    environment."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _flag_list(text: str) -> list[str]:
    values = comma_list(text)
    if not values:
        raise argparse.ArgumentTypeError("give at least one value (comma-separated)")
    return values


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
