"""Rubrics for the self-judge, per interaction type (`onthejob learn --rubrics FILE`).

A TOML file: `default` is the rubric of every type without its own (else the judge's
built-in rubric); `[types]` maps a type to its rubric, or to `false` to keep that type from
being judged by the served model at all:

    default = "Score 0-10: is the reply correct and helpful?"
    [types]
    "support-bot" = "Score 0-10: does the reply solve the customer's problem politely?"
    "internal-tool" = false

Invariant: a file that loaded is valid; a mistake names the file and the key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from learner.graders.judge_prompt import DEFAULT_RUBRIC

_KEYS = {"default", "types"}


class RubricsError(ValueError):
    """A rubrics file that cannot be used."""


@dataclass(frozen=True)
class Rubric:
    text: str
    source: str  # "type": the type's own, "default": the file's default or the built-in one


@dataclass(frozen=True)
class Rubrics:
    default: str = DEFAULT_RUBRIC
    by_type: dict[str, str | None] = field(default_factory=dict)  # None: not self-judged

    def for_type(self, interaction_type: str | None) -> Rubric | None:
        """The rubric to judge a trajectory of this type with; None: the type is off."""
        if interaction_type is not None and interaction_type in self.by_type:
            own = self.by_type[interaction_type]
            return None if own is None else Rubric(own, "type")
        return Rubric(self.default, "default")

    @classmethod
    def load(cls, path: str | Path) -> Rubrics:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise RubricsError(f"{path}: {exc}") from exc
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise RubricsError(f"{path}: unknown key {unknown[0]!r} (known: default, types)")
        default = data.get("default", DEFAULT_RUBRIC)
        if not isinstance(default, str) or not default.strip():
            raise RubricsError(f"{path}: 'default' must be a non-empty string")
        types = data.get("types", {})
        if not isinstance(types, dict):
            raise RubricsError(f"{path}: 'types' must be a table of type = rubric")
        by_type: dict[str, str | None] = {}
        for name, value in types.items():
            if value is False:
                by_type[name] = None
            elif isinstance(value, str) and value.strip():
                by_type[name] = value
            else:
                message = "must be a non-empty rubric string, or false (not self-judged)"
                raise RubricsError(f"{path}: types.{name!r} {message}")
        return cls(default=default, by_type=by_type)
