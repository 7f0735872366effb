"""Making the random tiny model call a tool: vLLM's structured outputs force the text.

The comment in each test says why it forces; the pieces live here once.
"""

from __future__ import annotations

# the one tool call every forced request produces (Hermes format, parsed by vLLM)
CALL_ADD_REGEX = r'<tool_call>\{"name": "add", "arguments": \{"a": 1, "b": 2\}\}</tool_call>'
FORCE_CALL = {"structured_outputs": {"regex": CALL_ADD_REGEX}}

# a bounded schema for `add`, shared by every API's tool definition
ADD_PARAMETERS = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "enum": [1, 2, 3]},
        "b": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
