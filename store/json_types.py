"""JSON as a type: what a body, a recorded request or an admin reply holds where its keys are
open (a client API's request, which newer clients extend with fields we have not seen; a
vLLM extension). Where the keys are known, a TypedDict or a dataclass names them instead.

The store is the base every process imports (proxy/ and learner/ meet only here), so the
one definition lives here.

A TypeAliasType rather than a string alias: SQLAlchemy (`Mapped[JsonObject | None]`),
pydantic and FastAPI evaluate annotations at runtime, which a string alias does not survive.
"""

from __future__ import annotations

from typing_extensions import TypeAliasType

JsonValue = TypeAliasType(
    "JsonValue", "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
)
JsonObject = dict[str, JsonValue]
