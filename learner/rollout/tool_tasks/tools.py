"""The tool-task family's three tools: their definitions in the OpenAI `tools` format and
their implementations, which a harness runs locally.

- `calculator(expression)`: arithmetic with + - * / and parentheses;
- `convert(value, from_unit, to_unit)`: length, mass, volume and temperature units;
- `lookup(name, field)`: a value from the database of fictional towns and products
  (facts.py).

Numbers come back as the model should write them: rounded to 2 decimals, no trailing zeros.

Invariant: `run_tool` never raises. Whatever the model sent (arguments that are not JSON,
a tool that does not exist, an argument missing, extra or of the wrong type, a unit or
field outside its enum, an entry the database lacks, an expression that is not arithmetic)
comes back as a `ToolResult` whose content starts with "Error: " and says what is wrong, so
the model can read it (and the next-turn signals count it as a failed tool call:
store/next_turn.py), and whose `error` says which of two kinds it was: MALFORMED (the call
does not fit the tool's definition: what a tool-call validity rate counts) or FAILED (a
well-formed call the tool could not answer). Standard library only: the harness imports it.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from learner.rollout.tool_tasks.facts import FACTS, FIELDS

if TYPE_CHECKING:  # the harness imports this module: standard library only at run time
    from store.json_types import JsonObject, JsonValue

MALFORMED = "malformed"  # the call does not fit the tool's definition
FAILED = "failed"  # a well-formed call the tool could not answer
DECIMALS = 2
MAX_EXPRESSION = 200  # characters
_MAX_MAGNITUDE = 1e15  # refuse absurd results instead of printing huge floats

# (the unit's dimension, its size in the dimension's base unit); temperatures are affine
UNITS: dict[str, tuple[str, float]] = {
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "cm": ("length", 0.01),
    "mi": ("length", 1609.344),
    "ft": ("length", 0.3048),
    "in": ("length", 0.0254),
    "kg": ("mass", 1.0),
    "g": ("mass", 0.001),
    "lb": ("mass", 0.45359237),
    "oz": ("mass", 0.028349523125),
    "l": ("volume", 1.0),
    "ml": ("volume", 0.001),
    "gal": ("volume", 3.785411784),
    "c": ("temperature", 1.0),
    "f": ("temperature", 1.0),
}


def _function(name: str, description: str, properties: JsonObject) -> JsonObject:
    # key order as vLLM serialises a request's tools, so a supervised sample rendered from
    # these definitions is byte for byte the prompt vLLM renders for the harness
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }


CALCULATOR_TOOL = _function(
    "calculator",
    "Evaluate an arithmetic expression with + - * / and parentheses; "
    "the result is rounded to 2 decimals.",
    {"expression": {"type": "string"}},
)
CONVERT_TOOL = _function(
    "convert",
    "Convert a value between units of length, mass, volume or temperature; "
    "the result is rounded to 2 decimals.",
    {
        "value": {"type": "number"},
        "from_unit": {"type": "string", "enum": list(UNITS)},
        "to_unit": {"type": "string", "enum": list(UNITS)},
    },
)
LOOKUP_TOOL = _function(
    "lookup",
    "Look up a field of a town (population, area_km2, elevation_m) or of a product "
    "(price_usd, weight_kg) in the database.",
    {"name": {"type": "string"}, "field": {"type": "string", "enum": list(FIELDS)}},
)
TOOLS: list[JsonObject] = [CALCULATOR_TOOL, CONVERT_TOOL, LOOKUP_TOOL]


@dataclass(frozen=True)
class ToolResult:
    content: str  # what the model reads in the tool message
    error: str | None = None  # MALFORMED, FAILED, or None for an answer


class ToolError(Exception):
    """A call the tool cannot answer; `kind` is MALFORMED or FAILED."""

    def __init__(self, message: str, kind: str = FAILED) -> None:
        super().__init__(message)
        self.kind = kind


def run_tool(name: str | None, arguments: str | Mapping[str, JsonValue] | None) -> ToolResult:
    """The result of one tool call as the API carries it: arguments as JSON text (or an
    object already parsed); a mistake is an error result, never an exception."""
    try:
        tool = _IMPLEMENTATIONS.get(name or "")
        if tool is None:
            known = ", ".join(_IMPLEMENTATIONS)
            raise ToolError(f"unknown tool {name!r:.80}; the tools are {known}", MALFORMED)
        return ToolResult(tool(checked_arguments(str(name), arguments)))
    except ToolError as exc:
        return ToolResult(f"Error: {exc}", exc.kind)


def checked_arguments(name: str, arguments: str | Mapping[str, JsonValue] | None) -> JsonObject:
    """The call's arguments as the tool's definition says them; ToolError(MALFORMED) if not."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError) as exc:
            message = f"the arguments of {name} are not valid JSON ({exc})"
            raise ToolError(message, MALFORMED) from None
    else:
        parsed = dict(arguments) if isinstance(arguments, Mapping) else arguments
    if not isinstance(parsed, dict):
        kind = _json_type(parsed)
        raise ToolError(f"the arguments of {name} must be a JSON object, got {kind}", MALFORMED)
    parameters = _SPECS[name]
    properties = parameters["properties"]
    assert isinstance(properties, dict)
    expected = ", ".join(properties)
    for key in parsed:
        if key not in properties:
            message = f"{name} takes no argument {key!r:.80} (its arguments: {expected})"
            raise ToolError(message, MALFORMED)
    for key, spec in properties.items():
        assert isinstance(spec, dict)
        if key not in parsed:
            message = f"{name} needs the argument {key!r} (its arguments: {expected})"
            raise ToolError(message, MALFORMED)
        parsed[key] = _checked_value(name, key, spec, parsed[key])
    return parsed


def _checked_value(tool: str, key: str, spec: JsonObject, value: JsonValue) -> JsonValue:
    if spec["type"] == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            got = _described(value)
            raise ToolError(f"{tool}'s {key!r} must be a number, got {got}", MALFORMED)
        if abs(value) > _MAX_MAGNITUDE or not math.isfinite(value):
            raise ToolError(f"{tool}'s {key!r} must be at most {_MAX_MAGNITUDE:g}", MALFORMED)
        return value
    if not isinstance(value, str):
        got = _described(value)
        raise ToolError(f"{tool}'s {key!r} must be a string, got {got}", MALFORMED)
    allowed = spec.get("enum")
    if isinstance(allowed, list):
        value = value.strip().lower()
        if value not in allowed:
            choices = ", ".join(str(a) for a in allowed)
            message = f"{tool}'s {key!r} must be one of {choices}; got {value!r:.80}"
            raise ToolError(message, MALFORMED)
    return value


def _described(value: JsonValue) -> str:
    """A value's JSON type, and the value itself when a scalar: an array or object is never
    serialised, so one nested past the recursion limit cannot raise here."""
    kind = _json_type(value)
    if isinstance(value, list | dict):
        return kind
    return f"{kind} {json.dumps(value)[:40]}"


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def format_number(value: float) -> str:
    """Rounded to 2 decimals, without trailing zeros: 3.0 -> "3", 2.50 -> "2.5"."""
    rounded = round(float(value), DECIMALS)
    if rounded == 0:
        return "0"  # not "-0"
    if rounded.is_integer():
        return str(int(rounded))
    return f"{rounded:.{DECIMALS}f}".rstrip("0").rstrip(".")


# ---- the tools


def calculator(arguments: JsonObject) -> str:
    return format_number(calculate(str(arguments["expression"])))


def convert(arguments: JsonObject) -> str:
    value, source, target = arguments["value"], arguments["from_unit"], arguments["to_unit"]
    assert isinstance(value, int | float) and isinstance(source, str) and isinstance(target, str)
    return format_number(convert_units(float(value), source, target))


def lookup(arguments: JsonObject) -> str:
    name, field = str(arguments["name"]), str(arguments["field"])
    entry = _entry(name)
    if field not in FACTS[entry]:
        fields = ", ".join(FACTS[entry])
        raise ToolError(f"{entry} has no field {field!r}; its fields: {fields}")
    return format_number(FACTS[entry][field])


def _entry(name: str) -> str:
    wanted = " ".join(name.split()).casefold()
    for entry in FACTS:
        if entry.casefold() == wanted:
            return entry
    close = difflib.get_close_matches(name.strip(), list(FACTS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ToolError(f"no entry named {name!r:.80} in the database{hint}")


_IMPLEMENTATIONS: dict[str, Callable[[JsonObject], str]] = {
    "calculator": calculator,
    "convert": convert,
    "lookup": lookup,
}


def _parameters_by_name(tools: list[JsonObject]) -> dict[str, JsonObject]:
    """Each tool's `parameters` (what `checked_arguments` checks a call against) by its name."""
    specs: dict[str, JsonObject] = {}
    for tool in tools:
        function = tool["function"]
        if not isinstance(function, dict):
            raise TypeError(f"not an OpenAI function tool: {tool!r:.200}")
        name, parameters = function["name"], function["parameters"]
        if not isinstance(name, str) or not isinstance(parameters, dict):
            raise TypeError(f"not an OpenAI function tool: {tool!r:.200}")
        specs[name] = parameters
    return specs


_SPECS = _parameters_by_name(TOOLS)


def convert_units(value: float, source: str, target: str) -> float:
    """`value` in `source` units as `target` units; ToolError across dimensions."""
    (dimension, size), (other, target_size) = UNITS[source], UNITS[target]
    if dimension != other:
        raise ToolError(f"cannot convert {source} ({dimension}) to {target} ({other})")
    if dimension != "temperature":
        return value * size / target_size
    celsius = value if source == "c" else (value - 32) * 5 / 9
    return celsius if target == "c" else celsius * 9 / 5 + 32


_OPERATORS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calculate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * /, parentheses, unary minus);
    ToolError saying why for anything else."""
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip().replace("\u00d7", "*"), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    if not abs(value) <= _MAX_MAGNITUDE:  # also NaN (inf / inf)
        raise ToolError("the result is too large")
    return value


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ToolError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ToolError("only numbers, + - * / and parentheses are allowed")
