"""Fault drills: what every drill asserts, and the traffic and learner they share.

Each drill breaks something for real (a process killed, a server stopped, a probe that
fails) and then `assert_invariants` checks the store: no step lost or doubled, every version
that served a call was verified, every graded trajectory is trained in a recorded step or
still pending, and nothing the proxy answered is missing.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file, save_file
from sqlalchemy import Engine, func, select

from learner.checkpoint import WEIGHTS_FILE
from learner.config import LearnerConfig
from learner.grouping import RunningBaselines
from learner.loop import Learner
from learner.proxy_process import ProxyServer
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.requests import SwapRequestWorker
from learner.trainer import Trainer
from learner.vllm_server import VLLMServer
from store import learner_state
from store.control import read_heartbeat
from store.models import Call, Grade, PolicyVersion, SwapGate, TrainingStep, Trajectory

TASK = "drill"
GRADER = "python:learner.toys.letter:share_of_a_reward"
DRILL_TOKEN = "drill-token"
# the proxy follows the swap gates quickly, so drills wait for swaps briefly
FAST_GATES = {"ONTHEJOB_GATE_POLL_INTERVAL": "0.05", "ONTHEJOB_ADMIN_TOKEN": DRILL_TOKEN}


def learner_config(db_url: str, vllm: VLLMServer, model: Path, tmp: Path, **extra: Any):
    values: dict[str, Any] = {
        "database_url": db_url,
        "upstreams": [vllm.url],
        "model": str(model),
        "checkpoints": str(tmp / "checkpoints"),
        "graders": [GRADER],
        "batch_trajectories": 8,
        "learning_rate": 1e-3,
        "truncated": "train",
        "poll_interval": 0.2,
        # the drills time the learner's publishes: no judge calls to the one vLLM measuring
        # the self-judge's agreement (tests/e2e/test_selfjudge_vllm.py does)
        "self_judge_shadow": 0.0,
        **extra,
    }
    return LearnerConfig(**values)


def drill_learner(db_url: str, vllm: VLLMServer, model: Path, tmp: Path, **extra: Any) -> Learner:
    return Learner(learner_config(db_url, vllm, model, tmp, **extra))


def swap_worker(learner: Learner) -> SwapRequestWorker:
    """The learner's worker for the admin API's rollbacks and promotes, started."""
    return SwapRequestWorker(
        learner.state.engine,
        learner.state.config.upstreams,
        drain_timeout=learner.state.config.swap_drain_timeout,
    ).start()


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll (bounded) until `condition()` is truthy; its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"never happened: {what}")
        time.sleep(0.02)


class Traffic:
    """Client calls through the proxy, counted per session: what the proxy answered."""

    def __init__(self, proxy: ProxyServer, model: str) -> None:
        self.proxy = proxy
        self.model = model
        self.answered: Counter[str] = Counter()
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def call(
        self, session: str, *, max_tokens: int = 16, timeout: float = 120, task: str = TASK
    ) -> httpx.Response:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"Write something ({session})."}],
            "max_tokens": max_tokens,
            "temperature": 1.0,
        }
        response = httpx.post(
            f"{self.proxy.url}/s/{session}/v1/chat/completions",
            json=body,
            headers={"X-Onthejob-Task": task},
            timeout=timeout,
        )
        with self._lock:
            self.answered[session] += 1
            if response.status_code != 200:
                self.failures.append(f"{session}: {response.status_code} {response.text[:200]}")
        return response

    def batch(self, name: str, n: int = 8) -> list[str]:
        """`n` one-call trajectories of the drill task, in parallel; their sessions."""
        sessions = [f"{name}-{i}" for i in range(n)]
        threads = [threading.Thread(target=self.call, args=(s,)) for s in sessions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sessions

    def in_parallel(self, sessions: list[str]) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.call, args=(s,), daemon=True) for s in sessions]
        for thread in threads:
            thread.start()
        return threads


class Stream:
    """A long streamed call through the proxy, in flight from `start()` until it ends."""

    def __init__(self, traffic: Traffic, session: str, max_tokens: int = 1500) -> None:
        self.traffic = traffic
        self.session = session
        self.max_tokens = max_tokens
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Stream:
        self._thread.start()
        assert self._started.wait(60), f"the stream never started: {self.error}"
        return self

    def finish(self, timeout: float = 120) -> list[str]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream never ended"
        return self.lines

    def _run(self) -> None:
        body = {
            "model": self.traffic.model,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": self.max_tokens,
            "temperature": 1.0,
            "stream": True,
            "ignore_eos": True,
        }
        url = f"{self.traffic.proxy.url}/s/{self.session}/v1/chat/completions"
        try:
            with httpx.stream("POST", url, json=body, timeout=300) as response:
                self.traffic.answered[self.session] += 1
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.lines.append(line)
                        self._started.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self._started.set()


def gated(proxy: ProxyServer) -> bool:
    return any(u["gated"] for u in proxy.health()["upstreams"])


def finished_count(engine: Engine, sessions: list[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(Trajectory)
                .where(Trajectory.session_key.in_(sessions), Trajectory.status == "finished")
            ).scalar_one()
        )


def graded_batch(traffic: Traffic, learner: Learner, engine: Engine, name: str) -> list[str]:
    """A batch of finished, graded trajectories of the drill task."""
    sessions = traffic.batch(name)
    wait_until(lambda: finished_count(engine, sessions) == len(sessions), f"{name} finished")
    wait_until(lambda: not learner.grade_finished(), f"{name} graded")
    return sessions


def wrong_weights_once(learner: Learner) -> None:
    """The learner's next version holds wrong weights that pass the file checks (its tied
    embeddings scaled): vLLM loads them, and only the probe can tell. By transfer, the
    tensors handed to the replicas are the wrong ones; by disk, the checkpoint's files."""
    if learner.state.transport == "transfer":
        served = learner.publishing.served_tensors

        def served_wrong() -> dict[str, Any]:
            learner.publishing.served_tensors = served  # type: ignore[method-assign]
            return _embeddings_scaled(served())

        learner.publishing.served_tensors = served_wrong  # type: ignore[method-assign]
        return
    save = learner.publishing.save

    def save_wrong(target: Path) -> Path:
        learner.publishing.save = save  # type: ignore[method-assign]
        checkpoint = save(target)
        path = checkpoint / WEIGHTS_FILE
        tensors = _embeddings_scaled(load_file(str(path)))
        save_file(tensors, str(path), metadata={"format": "pt"})
        return checkpoint

    learner.publishing.save = save_wrong  # type: ignore[method-assign]


def _embeddings_scaled(tensors: dict[str, Any]) -> dict[str, Any]:
    """The tied embeddings and LM head times 3: wrong weights that load like right ones."""
    return {
        name: tensor * 3.0 if "embed" in name or "lm_head" in name else tensor
        for name, tensor in tensors.items()
    }


def recorded(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(select(Call.session_key, func.count()).group_by(Call.session_key))
        return Counter({session: count for session, count in rows})


def assert_invariants(engine: Engine, answered: Counter[str] | None = None) -> None:
    if answered:
        # the proxy writes records in the background, shortly after each call
        wait_until(
            lambda: all(recorded(engine)[s] >= n for s, n in answered.items()),
            "every answered call recorded",
        )
    calls = recorded(engine)
    with engine.connect() as conn:
        steps = conn.execute(select(TrainingStep.step).order_by(TrainingStep.step)).scalars().all()
        versions = conn.execute(select(PolicyVersion.version, PolicyVersion.ordinal)).all()
        served = set(conn.execute(select(Call.policy_version).distinct()).scalars()) - {None}
        trained_in = set(conn.execute(select(Grade.trained_in_step).distinct()).scalars())
        closed = conn.execute(select(SwapGate.upstream).where(SwapGate.closed)).scalars().all()
    # no step lost or doubled
    assert list(steps) == list(range(1, len(steps) + 1)), steps
    # every version that served a call was verified (only verified versions get an ordinal)
    verified = {version for version, ordinal in versions if ordinal is not None}
    assert served <= verified, f"served by unverified versions: {served - verified}"
    # every graded trajectory is trained in a recorded step, or still pending
    assert trained_in - {None, -1} <= set(steps), (trained_in, steps)
    # nothing the proxy answered is missing from the store
    for session, count in (answered or {}).items():
        assert calls[session] == count, f"{session}: {calls[session]} recorded, {count} answered"
    assert not closed, f"replicas left fenced off: {closed}"


def learn_command(
    db_url: str,
    vllm: VLLMServer,
    model: Path,
    tmp: Path,
    *extra: str,
    entry: Sequence[str] = ("cli",),
) -> list[str]:
    """`onthejob learn` as the drills run it in a process of its own (`entry`: the module
    run with its arguments, tests.support.held_learner to hold the first step)."""
    return [
        sys.executable,
        "-m",
        *entry,
        "learn",
        "--db",
        db_url,
        "--upstream",
        vllm.url,
        "--model",
        str(model),
        "--checkpoints",
        str(tmp / "checkpoints"),
        "--grader",
        GRADER,
        "--batch-trajectories",
        "8",
        "--learning-rate",
        "1e-3",
        "--truncated",
        "train",
        "--poll-interval",
        "0.2",
        "--self-judge-shadow",
        "0",
        *extra,
    ]


def heartbeat(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return read_heartbeat(conn) or {}


def graded_count(engine: Engine, sessions: list[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(Grade)
                .join(Trajectory, Trajectory.id == Grade.trajectory_id)
                .where(Trajectory.session_key.in_(sessions))
            ).scalar_one()
        )


def trained_in(engine: Engine, sessions: list[str]) -> dict[str, int | None]:
    """The step that trained each session's graded trajectory (None: still pending)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Trajectory.session_key, Grade.trained_in_step)
            .join(Grade, Grade.trajectory_id == Trajectory.id)
            .where(Trajectory.session_key.in_(sessions))
        ).all()
    assert len(rows) == len({session for session, _ in rows}), rows
    return {str(session): step for session, step in rows}


def assert_baselines_count_each_reward_once(engine: Engine) -> None:
    """The running baselines the store keeps are every trained reward folded in once, step
    by step, in the order the learner takes them (a drill whose steps all train fresh
    traffic of verified versions): a step tried again after a fault must not count its
    batch twice."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Grade.trajectory_id, Trajectory.task_key, Grade.reward)
            .join(Trajectory, Trajectory.id == Grade.trajectory_id)
            .where(Grade.trained_in_step > 0)
            .order_by(Grade.trained_in_step, Grade.graded_at, Grade.trajectory_id)
        ).all()
        stored = learner_state.get_state(conn, "baselines") or {}
    replayed = RunningBaselines()
    for trajectory_id, task_key, reward in rows:
        replayed.update(task_key or trajectory_id, float(reward))
    assert stored == pytest.approx(replayed.state()), (stored, replayed.state())


def recorded_steps(engine: Engine) -> list[tuple[int, str | None]]:
    """(step, version) of every recorded step; the version None where it failed."""
    with engine.connect() as conn:
        rows = conn.execute(select(TrainingStep.step, TrainingStep.version)).all()
    return [(int(step), version) for step, version in rows]


def served_by(engine: Engine, sessions: list[str]) -> set[str | None]:
    """The policy versions the calls of these sessions were answered by."""
    with engine.connect() as conn:
        return set(
            conn.execute(
                select(Call.policy_version).where(Call.session_key.in_(sessions)).distinct()
            ).scalars()
        )


class LearnerThread:
    """`Learner.run()` in a thread of the test process; what it raised, if anything."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LearnerThread:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            activity = self.learner.state.activity
            self.stop()
            raise AssertionError(f"the learner is still at: {activity}")
        assert self.error is None, f"the learner failed: {self.error!r}"

    def stop(self, timeout: float = 60) -> None:
        """Ask it to stop (after any swap under way) and wait: a failed drill leaves no
        learner behind retrying against what the next test starts."""
        self.learner.state.stopping.request()
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self.learner.run()
        except BaseException as exc:  # reported by join()
            self.error = exc


class HeldPublish:
    """The first publish of a version named `prefix`... in this process holds once its
    replicas are fenced off and drained, before any swap, until `released` is set: a drill
    acts at that moment whatever the machine's speed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        swap_all = FullWeightPublisher._swap_all

        def held(
            publisher: FullWeightPublisher, client: Any, directory: Any, result: Any, *rest: Any
        ) -> None:
            if result.version.startswith(prefix) and not self.reached.is_set():
                self.reached.set()
                assert self.released.wait(120), "the held publish was never released"
            swap_all(publisher, client, directory, result, *rest)

        monkeypatch.setattr(FullWeightPublisher, "_swap_all", held)


class HeldStep:
    """The first optimizer step in this process holds once the weights have moved and
    before anything records the step (the moment a crash or an outage costs most), until
    `released` is set. On the class: a trainer the learner makes later holds too."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        step = Trainer.step

        def held(trainer: Trainer, samples: Any, advantages: Any, **kwargs: Any) -> dict[str, Any]:
            metrics = step(trainer, samples, advantages, **kwargs)
            if not self.reached.is_set():
                self.reached.set()
                assert self.released.wait(120), "the held step was never released"
            return metrics

        monkeypatch.setattr(Trainer, "step", held)
