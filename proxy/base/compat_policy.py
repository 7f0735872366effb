"""The compatibility policy of the translated APIs (Messages, Responses), and its record.

The rule, for every part of a request that is not plainly mapped onto the chat call:

- **honoured**: the proxy can act on it (a reasoning switch, an effort hint, a context
  edit), so it does, on the chat request it sends;
- **ignored** (accepted, recorded, not forwarded): it steers a vendor's own servers
  (caching, routing, billing, stored state, telemetry) and cannot change the tokens a
  self-hosted model samples;
- **unknown**: a request field this proxy has never been told about. Accepted, recorded
  and not forwarded like an ignored one: the vendors' APIs refuse fields they do not know,
  so a field we do not know is one a newer vendor API knows, and nearly all of those are
  server-side features. Refusing them would break every harness release that adds one;
  forwarding them would hand vLLM fields it would read as something else. The record
  names them, so an operator sees a new field the first day a harness sends it. This is
  for fields only: an unknown *content* block, input item or tool type is part of the
  conversation, and is never dropped silently;
- **flattened**: a tool group (Responses `namespace`) becomes plain function tools;
- **left_out**: a tool the served model cannot be given (run by the vendor, or defined by
  the vendor with a schema the request does not carry) is not shown to the model;
- **clamped**: an output limit larger than the context left is lowered to what fits;
- **refused**: what would change what the model must do and cannot be honoured is a 400
  that names it.

Invariant: what the translation did is recorded per call (`Compat.as_record`), keyed by
feature names without list indices, so calls aggregate per harness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from store.json_types import JsonObject

CATEGORIES = ("honoured", "ignored", "unknown", "flattened", "left_out", "clamped", "refused")
# `omit`: tools the model cannot be given are left out (recorded); `refuse`: a 400
HOSTED_TOOL_MODES = ("omit", "refuse")
_INDEX = re.compile(r"\.\d+(?=\.|$)|\[\d+\]")


def feature_name(path: str) -> str:
    """A field path without list indices: `tools.3.cache_control` -> `tools.cache_control`."""
    return _INDEX.sub("", path)


@dataclass
class Compat:
    """What one translation did with the parts of a request it did not simply map."""

    notes: dict[str, list[str]] = field(default_factory=dict)
    # per feature, what the record should say beyond its name (e.g. a clamp's numbers)
    detail: JsonObject = field(default_factory=dict)

    def note(self, category: str, feature: str) -> None:
        assert category in CATEGORIES, category
        listed = self.notes.setdefault(category, [])
        name = feature_name(feature)
        if name not in listed:
            listed.append(name)

    def has(self, category: str, feature: str) -> bool:
        return feature_name(feature) in self.notes.get(category, [])

    def as_record(self) -> JsonObject | None:
        """The `calls.compat` column: categories in a fixed order, then `detail`."""
        record: JsonObject = {c: self.notes[c] for c in CATEGORIES if self.notes.get(c)}
        if self.detail:
            record["detail"] = self.detail
        return record or None


def unmapped_fields(
    body: JsonObject,
    *,
    handled: frozenset[str],
    vendor_only: frozenset[str],
    compat: Compat,
    where: str = "",
) -> None:
    """Note the fields of `body` the translation does not map: vendor-only ones as
    ignored, the rest as unknown. Null values say nothing and are skipped."""
    for key, value in body.items():
        if value is None or key in handled:
            continue
        path = f"{where}.{key}" if where else key
        compat.note("ignored" if key in vendor_only else "unknown", path)


def fitting_output_limit(asked: int, *, prompt_tokens: int, context: int) -> int | None:
    """The output limit to send instead of `asked` when the prompt leaves less room, or
    None when `asked` fits (or when nothing fits: a prompt as long as the context is the
    client's to shorten, and vLLM's refusal says so)."""
    room = context - prompt_tokens
    if room < 1 or asked <= room:
        return None
    return room


def note_refusal(compat: Compat, param: str | None, message: str) -> None:
    """Record a translation's 400 on the call: the feature refused and why."""
    compat.note("refused", param or "body")
    compat.detail["refused"] = {"param": param, "message": message}
