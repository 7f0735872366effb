"""A multi-turn tool-using agent on the OpenAI SDK: a calculator and a file writer, both run
here, in the working directory. It loops until the model answers without a tool call (at
most 6 turns) and prints that answer.

Usage: tool_agent.py [PROMPT]   (without PROMPT: stdin, else ONTHEJOB_PROMPT)
"""

from __future__ import annotations

import ast
import json
import operator
import sys
from pathlib import Path
from typing import Any

from openai import OpenAI

from tests.support.harnesses.common import extra_body, max_tokens, model_name, prompt_from

MAX_TURNS = 6
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * /).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file in the working directory.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]


def calculate(expression: str) -> str:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * /")

    result = value(ast.parse(expression, mode="eval").body)
    return str(int(result) if float(result).is_integer() else result)


def write_file(path: str, content: str) -> str:
    target = (Path.cwd() / path).resolve()
    if Path.cwd().resolve() not in target.parents:
        raise ValueError("only files inside the working directory")
    target.write_text(content)
    return f"wrote {len(content)} characters to {path}"


def run_tool(name: str, arguments: str) -> str:
    try:
        args: dict[str, Any] = json.loads(arguments or "{}")
        if name == "calculator":
            return calculate(str(args["expression"]))
        if name == "write_file":
            return write_file(str(args["path"]), str(args["content"]))
        return f"error: unknown tool {name}"
    except Exception as exc:  # the model sees the error, as agents do
        return f"error: {exc}"


def main() -> int:
    prompt = prompt_from(sys.argv[1:])
    client = OpenAI(max_retries=0)
    model = model_name(client)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for turn in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=max_tokens(),
            extra_body=extra_body(turn),
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            print(message.content or "")
            return 0
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            output = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    print("gave up: too many turns", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
