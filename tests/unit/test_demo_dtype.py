"""What the demo serves in: bf16 where the CPU computes it natively, float32 elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.demo import vllm_server
from learner.demo.vllm_server import VLLMServer, cpu_has_native_bf16, resolve_dtype

EPYC = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
XEON_AMX = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
OLD = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"


@pytest.mark.parametrize(("cpuinfo", "native"), [(EPYC, True), (XEON_AMX, True), (OLD, False)])
def test_native_bf16_is_read_off_the_cpu_flags(tmp_path: Path, cpuinfo: str, native: bool) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert cpu_has_native_bf16(path) is native


def test_no_cpuinfo_means_no_bf16(tmp_path: Path) -> None:
    assert cpu_has_native_bf16(tmp_path / "missing") is False


def test_auto_follows_the_cpu_and_an_explicit_dtype_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("auto") == "bfloat16"
    monkeypatch.setattr(vllm_server, "cpu_has_native_bf16", lambda: False)
    assert resolve_dtype("auto") == "float32"
    assert resolve_dtype("bfloat16") == "bfloat16"


def test_the_server_command_carries_the_dtype(tmp_path: Path) -> None:
    command = VLLMServer(tmp_path, log_path=tmp_path / "log", dtype="bfloat16").command()
    assert command[command.index("--dtype") + 1] == "bfloat16"
    default = VLLMServer(tmp_path, log_path=tmp_path / "log").command()
    assert default[default.index("--dtype") + 1] == "float32"  # the tests' engine
