"""The dtype vLLM is started in is the one asked for (the demo's float32, a bench's bf16)."""

from __future__ import annotations

from pathlib import Path

from learner.demo.run import DemoConfig
from learner.demo.vllm_server import VLLMServer


def test_the_server_command_carries_the_dtype(tmp_path: Path) -> None:
    command = VLLMServer(tmp_path, log_path=tmp_path / "log", dtype="bfloat16").command()
    assert command[command.index("--dtype") + 1] == "bfloat16"
    default = VLLMServer(tmp_path, log_path=tmp_path / "log").command()
    assert default[default.index("--dtype") + 1] == "float32"


def test_the_demo_serves_float32() -> None:
    # bf16 swaps of the warmed-up model cannot be verified (bench/probe_tolerance.py)
    assert DemoConfig().dtype == "float32"
