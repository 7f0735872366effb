"""learner/rollout/tool_tasks/tools.py: the three tools, their definitions, and a clear
error (never an exception) for every malformed or unanswerable call."""

from __future__ import annotations

import json

import pytest

from learner.rollout.tool_tasks.tools import (
    FAILED,
    MALFORMED,
    MAX_EXPRESSION,
    TOOLS,
    format_number,
    run_tool,
)
from store.json_types import JsonObject, JsonValue
from store.next_turn import tool_failed


def _run(name: str | None, arguments: str | JsonObject | None) -> tuple[str, str | None]:
    result = run_tool(name, arguments)
    return result.content, result.error


def test_the_definitions_are_openai_function_tools() -> None:
    names = []
    for tool in TOOLS:
        assert list(tool) == ["type", "function"] and tool["type"] == "function"
        function = tool["function"]
        assert isinstance(function, dict)
        assert list(function) == ["name", "description", "parameters"]
        parameters = function["parameters"]
        assert isinstance(parameters, dict) and parameters["type"] == "object"
        assert isinstance(parameters["properties"], dict)
        assert parameters["required"] == list(parameters["properties"])
        names.append(function["name"])
    assert names == ["calculator", "convert", "lookup"]
    json.dumps(TOOLS)  # plain JSON, as a request carries it


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("10 / 4", "2.5"),
        ("1 / 3", "0.33"),
        ("-7 * 3", "-21"),
        ("8 * 357.5", "2860"),
        ("85268 / 22.7", "3756.3"),
    ],
)
def test_the_calculator(expression: str, result: str) -> None:
    assert _run("calculator", json.dumps({"expression": expression})) == (result, None)


@pytest.mark.parametrize(
    ("arguments", "result"),
    [
        ({"value": 42, "from_unit": "km", "to_unit": "mi"}, "26.1"),
        ({"value": 100, "from_unit": "c", "to_unit": "f"}, "212"),
        ({"value": 212, "from_unit": "f", "to_unit": "c"}, "100"),
        ({"value": 10.3, "from_unit": "kg", "to_unit": "oz"}, "363.32"),
        ({"value": 2.5, "from_unit": "gal", "to_unit": "l"}, "9.46"),
        ({"value": 787, "from_unit": "m", "to_unit": "km"}, "0.79"),
        ({"value": 5, "from_unit": "KM", "to_unit": " m "}, "5000"),  # units read leniently
    ],
)
def test_convert(arguments: JsonObject, result: str) -> None:
    assert _run("convert", json.dumps(arguments)) == (result, None)


@pytest.mark.parametrize(
    ("arguments", "result"),
    [
        ({"name": "Varnholt", "field": "population"}, "34319"),
        ({"name": "Marrowick", "field": "area_km2"}, "17.8"),
        ({"name": "Zephyr stool", "field": "price_usd"}, "209.5"),
        ({"name": "  zephyr   STOOL ", "field": "Weight_kg"}, "21.2"),  # case and spaces
    ],
)
def test_lookup(arguments: JsonObject, result: str) -> None:
    assert _run("lookup", json.dumps(arguments)) == (result, None)


def test_arguments_may_come_parsed() -> None:
    assert _run("lookup", {"name": "Varnholt", "field": "elevation_m"}) == ("251", None)


@pytest.mark.parametrize(
    ("name", "arguments", "kind", "message"),
    [
        # calls that do not fit the tool's definition
        ("search", "{}", MALFORMED, "unknown tool 'search'; the tools are calculator, convert"),
        (None, "{}", MALFORMED, "unknown tool None"),
        (
            "calculator",
            '{"expression": "2+2"',
            MALFORMED,
            "arguments of calculator are not valid JSON",
        ),
        ("calculator", "[1, 2]", MALFORMED, "must be a JSON object, got array"),
        ("calculator", '"2 + 2"', MALFORMED, "must be a JSON object, got string"),
        ("calculator", None, MALFORMED, "must be a JSON object, got null"),
        ("calculator", "", MALFORMED, "calculator needs the argument 'expression'"),
        ("calculator", '{"expr": "1"}', MALFORMED, "calculator takes no argument 'expr'"),
        (
            "calculator",
            '{"expression": 4}',
            MALFORMED,
            "'expression' must be a string, got number 4",
        ),
        (
            "convert",
            '{"value": "42", "from_unit": "km", "to_unit": "mi"}',
            MALFORMED,
            "convert's 'value' must be a number, got string \"42\"",
        ),
        (
            "convert",
            '{"value": true, "from_unit": "km", "to_unit": "mi"}',
            MALFORMED,
            "'value' must be a number, got boolean",
        ),
        (
            "convert",
            '{"value": 1, "from_unit": "kilometers", "to_unit": "mi"}',
            MALFORMED,
            "convert's 'from_unit' must be one of m, km, cm, mi, ft, in, kg",
        ),
        (
            "convert",
            '{"value": 1, "from_unit": "km"}',
            MALFORMED,
            "convert needs the argument 'to_unit'",
        ),
        (
            "lookup",
            '{"name": "Varnholt", "field": "height"}',
            MALFORMED,
            "lookup's 'field' must be one of population, area_km2, elevation_m, price_usd",
        ),
        # well-formed calls the tool cannot answer
        (
            "calculator",
            '{"expression": "__import__(\'os\')"}',
            FAILED,
            "only numbers, + - * / and parentheses are allowed",
        ),
        ("calculator", '{"expression": "2 +"}', FAILED, "not an arithmetic expression: '2 +'"),
        ("calculator", '{"expression": "1 / (2 - 2)"}', FAILED, "division by zero"),
        ("calculator", json.dumps({"expression": "1+" * 150 + "1"}), FAILED, "longer than 200"),
        ("calculator", '{"expression": "10000000 * 10000000 * 100"}', FAILED, "too large"),
        ("calculator", '{"expression": "1e308 * 10 / (1e308 * 10)"}', FAILED, "too large"),
        (
            "convert",
            '{"value": 1, "from_unit": "kg", "to_unit": "mi"}',
            FAILED,
            "cannot convert kg (mass) to mi (length)",
        ),
        (
            "lookup",
            '{"name": "Varnhot", "field": "population"}',
            FAILED,
            "no entry named 'Varnhot' in the database (did you mean 'Varnholt'?)",
        ),
        (
            "lookup",
            '{"name": "Atlantis", "field": "population"}',
            FAILED,
            "no entry named 'Atlantis' in the database",
        ),
        (
            "lookup",
            '{"name": "Varnholt", "field": "price_usd"}',
            FAILED,
            "Varnholt has no field 'price_usd'; its fields: population, area_km2, elevation_m",
        ),
    ],
)
def test_a_bad_call_gets_an_error_result_saying_what_is_wrong(
    name: str | None, arguments: str | None, kind: str, message: str
) -> None:
    content, error = _run(name, arguments)
    assert error == kind
    assert content.startswith("Error: ") and message in content, content
    # what the next-turn signals count as a failed tool call
    assert tool_failed(
        {
            "role": "tool",
            "text": content,
            "tool_calls": [],
            "tool_call_id": "c",
            "call_id": None,
            "is_error": False,
        }
    )


@pytest.mark.parametrize(
    "arguments",
    [
        "null",
        "{",
        "{}" * 3,
        '{"expression": null}',
        '{"expression": ["1"]}',
        "\x00",
        "1e999",
        "[" * 100_000,
        '{"value": 1e999, "from_unit": "m", "to_unit": "ft"}',
        f'{{"value": 1{"0" * 400}, "from_unit": "m", "to_unit": "ft"}}',
        f'{{"expression": "{"(" * 150}1{")" * 150}"}}',  # too long (nesting: below)
    ],
)
def test_nothing_the_model_sends_raises(arguments: JsonValue) -> None:
    for name in ("calculator", "convert", "lookup", "", "calculator "):
        result = run_tool(name, arguments if isinstance(arguments, str) else None)
        assert result.error in (MALFORMED, FAILED)


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("(" * 99 + "7" + ")" * 99, "7"),  # 199 characters
        ("-" * 199 + "7", "-7"),  # 200
        ("(" * 49 + "-" * 50 + "7" + ")" * 49, "7"),
    ],
)
def test_the_deepest_nesting_under_the_length_limit_computes(expression: str, result: str) -> None:
    """The length limit bounds the nesting: Python's parser refuses 200 levels of
    parentheses ('too many nested parentheses'), more than 200 characters can hold, and the
    evaluator's recursion is as deep, far from Python's limit; 150 levels are too long."""
    assert len(expression) <= MAX_EXPRESSION
    assert _run("calculator", {"expression": expression}) == (result, None)
    too_deep = "(" * 150 + "7" + ")" * 150
    assert _run("calculator", {"expression": too_deep}) == (
        f"Error: the expression is longer than {MAX_EXPRESSION} characters",
        FAILED,
    )


HUGE = "Q" * 100_000


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        (HUGE, "{}", "Error: unknown tool 'QQQ"),
        ("lookup", {"name": HUGE, "field": "population"}, "Error: no entry named 'QQQ"),
        ("lookup", {"name": "Varnholt", "field": HUGE}, "Error: lookup's 'field' must be one of"),
        ("calculator", {HUGE: "1"}, "Error: calculator takes no argument 'QQQ"),
    ],
)
def test_an_error_result_shows_at_most_80_characters_of_what_the_model_sent(
    name: str, arguments: str | JsonObject, message: str
) -> None:
    content, error = _run(name, arguments)
    assert error in (MALFORMED, FAILED) and content.startswith(message), content
    # 80 characters of its repr: the quote and 79 (an enum value is read in lower case)
    assert "q" * 79 in content.lower() and "q" * 80 not in content.lower()
    assert len(content) < 400


def _nested(depth: int) -> JsonValue:
    value: JsonValue = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("calculator", {"expression": _nested(5000)}, "'expression' must be a string, got object"),
        (
            "convert",
            {"value": _nested(5000), "from_unit": "m", "to_unit": "ft"},
            "'value' must be a number, got object",
        ),
        ("lookup", {"name": [_nested(5000)], "field": "population"}, "got array"),
    ],
)
def test_arguments_nested_past_the_recursion_limit_get_an_error_result(
    name: str, arguments: JsonObject, message: str
) -> None:
    """Arguments the harness parsed itself may be nested deeper than json.dumps can write."""
    content, error = _run(name, arguments)
    assert error == MALFORMED and content.startswith("Error: ") and message in content, content


@pytest.mark.parametrize(
    ("value", "text"), [(3.0, "3"), (2.50, "2.5"), (1 / 3, "0.33"), (-0.001, "0"), (1e6, "1000000")]
)
def test_numbers_are_written_to_two_decimals(value: float, text: str) -> None:
    assert format_number(value) == text
