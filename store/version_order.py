"""The order in which the dashboard and the admin API list policy versions."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


def version_order(ordinals: dict[str, int]) -> Callable[[str | None], tuple[Any, ...]]:
    """Versions in the order they served (their ordinals: step-2 before step-10), then those
    the store does not order, by name with numbers compared as numbers, then none."""

    def key(version: str | None) -> tuple[Any, ...]:
        if version is None:
            return (2, 0, ())
        if version in ordinals:
            return (0, ordinals[version], ())
        parts = re.split(r"(\d+)", version)
        return (1, 0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts))

    return key
