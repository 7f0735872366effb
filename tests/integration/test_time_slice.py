"""The trainer takes the cores in turn with the replicas on its host (learner/time_slice.py),
against fake replicas over real HTTP: paused around the compute, always resumed, torch's
threads handed over and given back, a replica that cannot be paused trained beside."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from learner.time_slice import TimeSlice, resume_left_paused
from tests.support.fake_vllm import FakeReplica, FakeVLLM


@pytest.fixture
def slices() -> Iterator[Callable[..., TimeSlice]]:
    """TimeSlice(...) whose guard process is stopped at the test's end (a test closes it
    while its replica still listens: a guard retries a replica that is away)."""
    made: list[TimeSlice] = []

    def make(replicas: list[str], threads: int) -> TimeSlice:
        made.append(TimeSlice(replicas, threads))
        return made[-1]

    yield make
    for slice_ in made:
        slice_.close()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_auto_takes_the_replicas_on_this_host_and_every_core() -> None:
    chosen = TimeSlice.choose(
        "auto", ["http://127.0.0.1:8000/", "http://gpu-box:8000"], cores=6, on_gpu=False
    )
    assert chosen.replicas == ["http://127.0.0.1:8000"]
    assert chosen.threads == 6
    assert "1 replica(s) on this host paused" in chosen.why()


@pytest.mark.parametrize(
    ("mode", "upstreams", "on_gpu"),
    [
        ("off", ["http://127.0.0.1:8000"], False),
        ("auto", ["http://127.0.0.1:8000"], True),  # the trainer has a GPU of its own
        ("auto", ["http://gpu-box:8000"], False),  # no replica on this host
    ],
)
def test_nothing_is_paused_where_the_cores_are_not_shared(
    mode: str, upstreams: list[str], on_gpu: bool
) -> None:
    chosen = TimeSlice.choose(mode, upstreams, cores=2, on_gpu=on_gpu)
    assert not chosen.active
    assert chosen.why() == "off"


def test_the_replica_is_paused_while_the_step_computes_on_every_core(
    slices: Callable[..., TimeSlice],
) -> None:
    threads_before = torch.get_num_threads()
    with FakeReplica() as replica:
        slice_ = slices([replica.url], threads_before + 1)
        with slice_.training() as paused:
            seen = (list(replica.controls), torch.get_num_threads(), list(paused))
        assert seen == (["pause"], threads_before + 1, [replica.url])
        assert replica.controls == ["pause", "resume"]
        # frozen, not restarted: vLLM's pause clears the caches unless told not to
        assert "POST /pause?mode=keep&clear_cache=false" in replica.targets
        slice_.close()
    assert torch.get_num_threads() == threads_before


def test_a_failed_step_still_resumes_the_replica(slices: Callable[..., TimeSlice]) -> None:
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        with pytest.raises(RuntimeError, match="out of memory"), slice_.training():
            raise RuntimeError("out of memory")
        assert replica.controls == ["pause", "resume"]
        slice_.close()


def test_the_replicas_control_is_held_from_pause_to_resume(
    slices: Callable[..., TimeSlice],
) -> None:
    """An admin swap (learner/swap/requests.py) takes the same control, so it never runs on
    replicas the slice froze, and never resumes them mid-step."""
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        for fails in (False, True):
            with contextlib.suppress(RuntimeError), slice_.training():
                held = not slice_.control.acquire(blocking=False)
                if fails:
                    raise RuntimeError("out of memory")
            assert held
            assert slice_.control.acquire(blocking=False)  # given back, after the resume
            slice_.control.release()
        assert replica.controls == ["pause", "resume"] * 2
        slice_.close()


def test_resume_is_retried_until_the_replica_answers(slices: Callable[..., TimeSlice]) -> None:
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        with slice_.training():
            replica.refuse_controls = 2  # the next two (resumes) answer 500
        assert replica.controls == ["pause", "resume", "resume", "resume"]
        assert not slice_.owed
        slice_.close()


def test_a_resume_that_keeps_failing_is_owed_and_retried_at_the_next_look(
    slices: Callable[..., TimeSlice],
) -> None:
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        with slice_.training():
            replica.refuse_controls = 4  # every try of this resume answers 500
        assert slice_.owed == {replica.url}
        slice_.retry_owed()
        assert replica.controls == ["pause"] + ["resume"] * 5
        assert not slice_.owed
        slice_.close()


def test_a_pause_answered_with_an_error_is_resumed_all_the_same(
    slices: Callable[..., TimeSlice],
) -> None:
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        replica.refuse_controls = 1  # the pause answers 500, and may have paused it
        with slice_.training() as paused:
            assert paused == []
        assert replica.controls == ["pause", "resume"]
        assert not slice_.unpausable  # tried again next step
        slice_.close()


def test_a_step_longer_than_the_limit_has_the_replicas_resumed_early(
    slices: Callable[..., TimeSlice],
) -> None:
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        slice_.max_pause = 0.2
        with slice_.training():
            wait_for(lambda: replica.controls == ["pause", "resume"], "the early resume")
        slice_.close()


def test_a_replica_that_cannot_be_paused_is_said_once_and_trained_beside(
    caplog: pytest.LogCaptureFixture, slices: Callable[..., TimeSlice]
) -> None:
    threads_before = torch.get_num_threads()
    with FakeVLLM() as replica, caplog.at_level(logging.WARNING, "onthejob.learner"):
        slice_ = slices([replica.url], threads_before + 1)
        for _ in range(2):
            with slice_.training():
                assert torch.get_num_threads() == threads_before  # nothing was handed over
        slice_.close()
    warnings = [r.getMessage() for r in caplog.records if "cannot be paused" in r.getMessage()]
    assert len(warnings) == 1
    assert "VLLM_SERVER_DEV_MODE=1" in warnings[0]


def test_a_start_resumes_what_a_killed_learner_left_paused() -> None:
    with FakeReplica() as replica:
        resume_left_paused(TimeSlice([replica.url], 1))
        assert replica.controls == ["resume"]
    resume_left_paused(TimeSlice(["http://127.0.0.1:9"], 1))  # nothing listens: said nothing


def test_torch_threads_set_by_hand_are_what_the_trainer_computes_on() -> None:
    chosen = TimeSlice.choose(
        "auto", ["http://localhost:8000"], cores=8, on_gpu=False, requested_threads=3
    )
    assert chosen.threads == 3


def test_a_replica_away_for_now_is_tried_again_at_the_next_step(
    slices: Callable[..., TimeSlice],
) -> None:
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        replica.down()
        with slice_.training():
            pass
        assert slice_.guard is None and not slice_.owed  # nothing reached: nothing owed
        replica.up()
        with slice_.training():
            pass
        assert replica.controls == ["pause", "resume"]
        assert not slice_.unpausable
        slice_.close()


def test_a_clean_stop_has_the_guard_resume_and_exit(slices: Callable[..., TimeSlice]) -> None:
    with FakeReplica() as replica:
        slice_ = slices([replica.url], 1)
        with slice_.training():
            pass
        guard = slice_.guard
        assert guard is not None and guard.poll() is None  # it waits on the learner
        slice_.close()
        assert guard.returncode == 0
        assert replica.controls == ["pause", "resume", "resume"]


KILLED_MID_STEP = """
import sys, time
from learner.time_slice import TimeSlice
held = TimeSlice([sys.argv[1]], 1).training()  # kept: a collected one would resume
held.__enter__()
print("paused", flush=True)
time.sleep(600)
"""


def test_a_learner_killed_mid_step_leaves_no_replica_paused() -> None:
    with FakeReplica() as replica:
        learner = subprocess.Popen(
            [sys.executable, "-c", KILLED_MID_STEP, replica.url], stdout=subprocess.PIPE, text=True
        )
        try:
            assert learner.stdout is not None and learner.stdout.readline() == "paused\n"
            assert replica.controls == ["pause"]
        finally:
            learner.kill()
            learner.wait()
        wait_for(lambda: replica.controls == ["pause", "resume"], "the guard's resume")
