"""The environment is read by the settings alone (issue 43): proxy/settings.py,
learner/config.py and store/environment.py. Elsewhere in the product `os.environ` may only be
passed on whole to a child process (`{**os.environ, ...}`); the demo's harnesses and the tool
tasks' harnesses are black-box programs of their own, which read their protocol from their
environment, and the vLLM plugin's code runs in vLLM's processes, whose environment is
vLLM's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("cli", "proxy", "learner", "store")
SETTINGS = {"proxy/settings.py", "learner/config.py", "store/environment.py"}
HARNESSES = (
    "learner/demo/harnesses/",
    "learner/rollout/tool_tasks/agent.py",
    # the third-party frameworks' harnesses and what they share
    "learner/rollout/tool_tasks/frameworks.py",
    "learner/rollout/tool_tasks/pydantic_ai_agent.py",
    "learner/rollout/tool_tasks/openai_agents_agent.py",
    # our vLLM plugin's fixes run in vLLM's processes: their environment is vLLM's
    "learner/swap/vllm_idle_spin.py",
)


def environment_reads(source: str) -> list[int]:
    """Lines that read the environment, other than passing it on whole in a dict display."""
    tree = ast.parse(source)
    passed_on = {
        id(value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        for key, value in zip(node.keys, node.values, strict=True)
        if key is None  # {**mapping}
    }
    lines = []
    for node in ast.walk(tree):
        reads = (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "environb")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        )
        if reads and id(node) not in passed_on:
            lines.append(node.lineno)
    return lines


def test_the_checker_tells_a_read_from_passing_the_environment_on() -> None:
    assert environment_reads("import os\nenv = {**os.environ, 'A': '1'}\n") == []
    assert environment_reads("import os\nx = os.environ.get('A')\n") == [2]
    assert environment_reads("import os\nx = os.getenv('A')\n") == [2]
    assert environment_reads("import os\nx = os.environ['A']\n") == [2]


def test_only_the_settings_read_the_environment() -> None:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name in SETTINGS or name.startswith(HARNESSES):
                continue
            found += [f"{name}:{line}" for line in environment_reads(path.read_text())]
    assert found == [], found
