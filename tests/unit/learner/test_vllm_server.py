"""The dtype vLLM is started in is the one asked for (the demo's, a bench's bf16), and "auto"
is the one the CPU computes natively."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learner.vllm_server import VLLMServer, serving_dtype


def test_the_server_command_carries_the_dtype(tmp_path: Path) -> None:
    command = VLLMServer(tmp_path, log_path=tmp_path / "log", dtype="bfloat16").command()
    assert command[command.index("--dtype") + 1] == "bfloat16"
    default = VLLMServer(tmp_path, log_path=tmp_path / "log").command()
    assert default[default.index("--dtype") + 1] == "float32"


def test_auto_serves_bf16_where_the_cpu_computes_it_natively(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert serving_dtype("float32") == "float32"
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda n=native: n)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        assert serving_dtype("auto") == expected
