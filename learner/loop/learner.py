"""`onthejob learn`: grade finished trajectories, run GRPO on their exact tokens, publish.

One iteration: grade what finished -> if enough trajectories carry a signal, one optimizer
step -> checkpoint -> hot-swap into every vLLM replica -> verify -> record -> serve. A version
that fails verification never serves anyone (learner/swap/publisher.py): the previous version
keeps serving and the trainer returns to its weights. Publishing holds the publish lease
(learner/swap/lease.py), so operators' rollbacks and the learner's publishes never interleave.

Invariant: a step is recorded, with the trajectories it trained on, in the transaction that
records its version, before anyone is served by it; whatever interrupts a step before that
(a crash, the database going away, an operator's rollback) leaves its batch untrained, the
running baselines without its rewards and the trainer back on the serving weights, so no
step is lost or done twice. Everything the learner needs to resume lives in the database
and the checkpoints.
"""

from __future__ import annotations

import logging

import torch
from sqlalchemy.exc import DBAPIError

from learner import control, grading, shadow_judging
from learner.config import LearnerConfig
from learner.distributed import Ranks
from learner.loop.canaries import Canaries
from learner.loop.grading import Grading
from learner.loop.guarding import Guarding
from learner.loop.publish import Publishing
from learner.loop.startup import StartUp
from learner.loop.state import LoopState, RestoreFailed
from learner.loop.step import Stepping
from learner.loop.supervised import Supervising
from learner.loop.tenants import Tenants
from learner.loop.weights import Weights
from learner.swap.requests import SwapRequestWorker
from learner.threads import choose_threads, usable_cores
from learner.time_slice import TimeSlice, resume_left_paused
from store import db, schema

log = logging.getLogger("onthejob.learner")

RETRY_CAP = 10.0  # seconds between tries at most, while the database or vLLM is away


class Learner:
    """The orchestrator: set up, then look at the world until stopped (`iterate`). It holds
    the loop's state and its parts (learner/loop/*.py), which hold the state and the parts
    they call: weights, grading, publishing, guarding, stepping, start-up, tenants, canaries."""

    def __init__(self, config: LearnerConfig, ranks: Ranks | None = None) -> None:
        """`ranks`: this is rank 0 of several (torchrun), which train the model sharded
        (learner/distributed.py); everything else is this process's alone."""
        if ranks is not None and config.lora:
            raise ValueError("--lora trains on one device: launch it without torchrun")
        if ranks is not None and config.supervised_steps:
            raise ValueError("--supervised-steps trains on one device: launch it without torchrun")
        _set_threads(config, sharded=ranks is not None)
        if ranks is not None:
            log.info("training sharded over %d ranks (FSDP2) on %s", ranks.world, ranks.device)
        schema.require(config.database_url, migrate=config.migrate, who="learner")
        engine = db.make_engine(config.database_url)
        # the self-judge's shadow verdicts come from a thread of their own (run), not from
        # grading: a step never waits on them
        grader = grading.learner_grader(config, engine, shadow_inline=False)
        self.state = state = LoopState(config, ranks, engine, grader)
        state.time_slice = _time_slice(config, sharded=ranks is not None)
        state.checkpoints.mkdir(parents=True, exist_ok=True)
        if config.turn_credit:
            _say_turn_credit(config)
        self.weights = Weights(state)
        self.grading = Grading(state)
        self.publishing = Publishing(state, self.weights)
        self.guarding = Guarding(state, self.weights)
        self.stepping = Stepping(state, self.weights, self.publishing, self.guarding)
        self.supervising = Supervising(state, self.weights, self.publishing)
        self.startup = StartUp(state, self.weights, self.publishing, self.guarding)
        self.tenants = Tenants(state, self.weights, self.publishing, self.guarding, self.stepping)
        self.canaries = Canaries(
            engine,
            state.reporter,
            lambda: state.step,
            upstreams=config.upstreams,
            drain_timeout=config.swap_drain_timeout,
        )
        self.heartbeat = control.Heartbeat(state)

    # -- the loop ---------------------------------------------------------------------
    def start(self) -> None:
        self.startup.start()

    def grade_finished(self) -> int:
        return self.grading.grade_finished()

    def maybe_train(self) -> bool:
        """At most one step: the shared policy's, or (--tenants) one tenant's; the
        supervised stage (--supervised-steps) before the shared policy's first."""
        if self.state.config.tenants:
            return self.tenants.train()
        if self.supervising.pending():
            return self.supervising.maybe_train()
        return self.stepping.maybe_train()

    def run(self) -> None:
        state = self.state
        self.start()
        self.heartbeat.start()
        # the admin API's rollbacks and promotes: the learner carries out every swap
        requests = SwapRequestWorker(
            state.engine,
            state.config.upstreams,
            drain_timeout=state.config.swap_drain_timeout,
            replica_control=state.time_slice.control,  # never mid-step, while paused
        ).start()
        shadow = None
        if shadow_judging.judges_in_shadow(state.grader):
            shadow = shadow_judging.ShadowJudging(state.engine, state.grader, lambda: state.tasks)
            shadow.start()
        failures = 0
        try:
            while not state.stopping.requested and (
                state.config.max_steps is None or state.step < state.config.max_steps
            ):
                try:
                    self.iterate()
                    failures = 0
                except (DBAPIError, RestoreFailed) as exc:
                    if isinstance(exc, DBAPIError) and not _unreachable(exc):
                        raise  # a refused statement is a bug, not an outage
                    failures += 1
                    # back off, but look again soon: the sooner it is back, the better
                    wait = min(state.config.poll_interval * 2.0**failures, RETRY_CAP)
                    state.activity = f"retrying in {wait:g}s: {_first_line(exc)}"
                    log.warning("%s; trying again in %gs", _first_line(exc), wait)
                    state.stopping.wait(wait)
        finally:
            state.time_slice.close()  # first: its guard resumes any replica a signal left paused
            requests.stop()
            if shadow is not None:
                shadow.stop()
            self.heartbeat.stop()
            self.weights.save_optimizer_at_stop()
            self.tenants.save_at_stop()
            state.reporter.close()
            if state.shared.publisher is not None:
                state.shared.publisher.close()  # a transfer's weight files: a model's size

    def iterate(self) -> None:
        """One look at the world: restore what serves if it needs it, follow the operator,
        grade, maybe train."""
        state = self.state
        if state.ranks is not None:
            state.ranks.keepalive()
        state.time_slice.retry_owed()  # a replica whose resume failed serves no one
        if state.shared.needs_restore or self.startup.gates_left_closed():
            self.startup.restore()
        if control.follow(state):  # operator pause and live knobs (admin API)
            state.shared.traffic.reset()  # a pause is no wait for idle replicas
            state.shared.fresh.reset()
            return
        state.activity = "grading"
        graded = self.grade_finished()
        self.canaries.decide_running()
        trained = self.maybe_train()
        if not graded and not trained:
            state.activity = "waiting for trajectories"
            state.stopping.wait(state.config.poll_interval)


def _set_threads(config: LearnerConfig, *, sharded: bool) -> None:
    """The trainer's threads: what --torch-threads says, or (0) what the cores on this host
    that its replicas leave free allow (learner/threads.py)."""
    threads = choose_threads(
        config.torch_threads,
        config.upstreams,
        cores=usable_cores(),
        on_gpu=_trains_on_gpu(config.device),
        sharded=sharded,
    )
    if threads.threads:
        torch.set_num_threads(threads.threads)
    log.info("trainer threads: %s", threads.why)


def _time_slice(config: LearnerConfig, *, sharded: bool) -> TimeSlice:
    """Whether the trainer pauses the replicas on its host while it computes (--time-slice),
    said once; a learner killed mid-step may have left them paused: resumed here."""
    chosen = TimeSlice.choose(
        "off" if sharded else config.time_slice,
        config.upstreams,
        cores=usable_cores(),
        on_gpu=_trains_on_gpu(config.device),
        requested_threads=config.torch_threads,
    )
    log.info("time slice: %s", chosen.why())
    resume_left_paused(chosen)
    return chosen


def _say_turn_credit(config: LearnerConfig) -> None:
    log.info("per-turn credit: each reply trains on its own next-turn signal")
    if not any(g.startswith("next_turn") for g in config.graders):
        log.warning(
            "--credit turn trains replies on the next-turn signals in their grades: "
            "only trajectories graded by next_turn (here: rollout runs whose runner "
            "used it) have them; the others train nothing"
        )


def _trains_on_gpu(device: str | None) -> bool:
    """Whether the trainer computes on a GPU (--device, else cuda when there is one)."""
    if device is not None:
        return not device.startswith("cpu")
    return torch.cuda.is_available()


def _unreachable(exc: DBAPIError) -> bool:
    """The database is away (refused, dropped, restarting), as opposed to refusing a query."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
