"""learner/swap/vllm_idle_spin.py on vLLM's own shared-memory reader: an idle reader of a
CPU replica stops spinning after SPIN_S, not vLLM's second; writers are left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zmq
from vllm.distributed.device_communicators import shm_broadcast
from vllm.platforms import current_platform

from learner.swap import vllm_idle_spin
from learner.swap.vllm_idle_spin import ENV, PATCHED, SPIN_S, install, spin_seconds


@pytest.fixture
def condition(monkeypatch: pytest.MonkeyPatch) -> type:
    """vLLM's SpinCondition with its own __init__ (unwrapped, had anything installed the fix in
    this process already), put back as it was after the test."""
    init = shm_broadcast.SpinCondition.__init__
    if getattr(init, PATCHED, False):
        init = init.__wrapped__
    monkeypatch.setattr(shm_broadcast.SpinCondition, "__init__", init)
    return shm_broadcast.SpinCondition


def made(condition: type, *, reader: bool, tmp_path: Path) -> Any:
    context = zmq.Context.instance()
    address = f"ipc://{tmp_path}/notify-{'r' if reader else 'w'}"
    return condition(is_reader=reader, context=context, notify_address=address)


def test_vllm_spins_a_second_after_each_read(condition: type, tmp_path: Path) -> None:
    """What the fix is for, as shipped."""
    assert made(condition, reader=True, tmp_path=tmp_path).busy_loop_s == 1


def test_a_cpu_replica_s_readers_spin_for_spin_s(condition: type, tmp_path: Path) -> None:
    assert current_platform.is_cpu()
    install()
    install()  # vLLM may load plugins twice in one process: wrapped once
    assert getattr(condition.__init__, PATCHED)
    assert getattr(condition.__init__.__wrapped__, PATCHED, False) is False
    assert made(condition, reader=True, tmp_path=tmp_path).busy_loop_s == SPIN_S
    assert made(condition, reader=False, tmp_path=tmp_path).busy_loop_s == 0


def test_the_environment_chooses_the_spin_and_bad_values_fall_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert spin_seconds({}) == SPIN_S
    assert spin_seconds({ENV: "0.5"}) == 0.5
    assert spin_seconds({ENV: "0"}) == 0
    for bad in ("-1", "nan", "soon"):
        assert spin_seconds({ENV: bad}) == SPIN_S
    assert "ONTHEJOB_VLLM_SPIN_S='soon' is not a number" in caplog.text
    monkeypatch.setattr(vllm_idle_spin, "SPIN_S", 0.001)
    assert spin_seconds({}) == 0.001
