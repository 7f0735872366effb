"""A tool call's arguments as what they mean, not how a client spelt them back.

Harnesses send the model's tool calls back in the next request, and not always byte for
byte: pydantic-ai re-serialises arguments as compact JSON, an API translation turns
Anthropic's `input` object into text, and arguments that were not JSON come back wrapped as
`{"INVALID_JSON": "<the text>"}` (the wrapper Anthropic's tool-use docs recommend, which
pydantic-ai sends). Whoever asks whether a request repeats an earlier reply (the proxy's
stitching, the conversation view of a trajectory) compares `canonical_arguments` instead.
"""

from __future__ import annotations

from typing import Any

import orjson

INVALID_JSON_KEY = "INVALID_JSON"


def canonical_arguments(arguments: Any) -> Any:
    """Parsed JSON for JSON text, the text itself when it is not JSON; the INVALID_JSON
    wrapper as what it wraps (the model's text: it may be JSON, only not an object);
    anything else as it is."""
    if not isinstance(arguments, str):
        return arguments
    parsed = _parsed(arguments)
    if isinstance(parsed, dict) and len(parsed) == 1:
        wrapped = parsed.get(INVALID_JSON_KEY)
        if isinstance(wrapped, str):
            return _parsed(wrapped)
    return parsed


def _parsed(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
