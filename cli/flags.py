"""Command-line flags generated from the settings' fields (store/settings_fields.py), so
that a setting is written once.

``add_flags`` gives every field a flag typed from its annotation: a bool gets
``--name/--no-name``, a ``Literal`` its choices, a list either a repeatable flag or a
comma-separated value; a field annotated with a ``FlagParse`` is read by its function. Flags
default to None, so ``given`` returns only what was typed: the settings' own sources (TOML
file, environment) fill in the rest. A positional field is always typed: no other source
fills it in.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from store.settings_fields import (
    FlagParse,
    argument_name,
    cli_extra,
    comma_list,
    flag_name,
    shown_default,
)
from store.url import database_setting

_METAVARS: dict[Any, str] = {int: "N", float: "X", str: "TEXT", Path: "PATH"}
S = TypeVar("S", bound=BaseSettings)


class ArgumentOptions(TypedDict, total=False):
    """What `add_argument` is given for a field, besides its names."""

    help: str
    metavar: str
    type: Callable[[str], Any]
    action: type[argparse.Action] | str
    choices: list[str]


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


def _flag_list(text: str) -> list[str]:
    values = comma_list(text)
    if not values:
        raise argparse.ArgumentTypeError("give at least one value (comma-separated)")
    return values


class DatabaseFlag(BaseSettings):
    """The flag of the commands whose one setting is the database (`db`, `eval-report`,
    `tasks`): read as ``args.db`` and resolved by ``store.url.database_url``, which also
    reads the environment."""

    db: str | None = database_setting()


def add_db(parser: argparse.ArgumentParser) -> None:
    """The `--db` flag every command that opens the store takes."""
    add_flags(parser, DatabaseFlag)
