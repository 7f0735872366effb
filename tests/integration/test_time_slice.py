"""The trainer takes the cores in turn with the replicas on its host (learner/time_slice.py),
against fake replicas over real HTTP: paused around the compute, always resumed, torch's
threads handed over and given back, a replica that cannot be paused trained beside."""

from __future__ import annotations

import logging

import pytest
import torch

from learner.time_slice import TimeSlice, resume_left_paused
from tests.support.fake_vllm import FakeReplica, FakeVLLM


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


def test_the_replica_is_paused_while_the_step_computes_on_every_core() -> None:
    threads_before = torch.get_num_threads()
    with FakeReplica() as replica:
        slice_ = TimeSlice([replica.url], threads_before + 1)
        with slice_.training() as paused:
            seen = (list(replica.controls), torch.get_num_threads(), list(paused))
        assert seen == (["pause"], threads_before + 1, [replica.url])
        assert replica.controls == ["pause", "resume"]
    assert torch.get_num_threads() == threads_before


def test_a_failed_step_still_resumes_the_replica() -> None:
    with FakeReplica() as replica:
        slice_ = TimeSlice([replica.url], 1)
        with pytest.raises(RuntimeError, match="out of memory"), slice_.training():
            raise RuntimeError("out of memory")
        assert replica.controls == ["pause", "resume"]


def test_resume_is_retried_until_the_replica_answers() -> None:
    with FakeReplica() as replica:
        slice_ = TimeSlice([replica.url], 1)
        with slice_.training():
            replica.refuse_controls = 2  # the next two (resumes) answer 500
        assert replica.controls == ["pause", "resume", "resume", "resume"]


def test_a_replica_that_cannot_be_paused_is_said_once_and_trained_beside(
    caplog: pytest.LogCaptureFixture,
) -> None:
    threads_before = torch.get_num_threads()
    with FakeVLLM() as replica, caplog.at_level(logging.WARNING, "onthejob.learner"):
        slice_ = TimeSlice([replica.url], threads_before + 1)
        for _ in range(2):
            with slice_.training():
                assert torch.get_num_threads() == threads_before  # nothing was handed over
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


def test_a_replica_away_for_now_is_tried_again_at_the_next_step() -> None:
    with FakeReplica() as replica:
        slice_ = TimeSlice([replica.url], 1)
        replica.down()
        with slice_.training():
            pass
        replica.up()
        with slice_.training():
            pass
        assert replica.controls == ["pause", "resume"]
        assert not slice_.unpausable
