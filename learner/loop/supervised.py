"""The supervised stage (`learn --supervised-steps N`): before any GRPO step, N cross-entropy
steps on recorded trajectories rendered again for the served model (learner/supervised/),
then one verified swap, recorded as a step (its metrics say `stage: supervised`). GRPO goes
on from the student's own traffic in the same loop.

It runs once per database: a learner that finds the stage's published step recorded goes on
with GRPO. A stage interrupted before its record leaves nothing behind (the trainer goes back
to the serving weights) and runs again, as a step does."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from typing import Any

from learner.loop.publish import Publishing
from learner.loop.state import LoopState
from learner.loop.weights import Weights
from learner.supervised.messages import last_answered
from learner.supervised.render import Renderer
from store import supervised_sources, training_steps
from store.json_types import JsonObject
from store.samples import Sample
from store.trajectory_loading import load_trajectories

log = logging.getLogger("onthejob.learner")

STAGE = "supervised"  # a step's metrics["stage"]: what says the stage ran
FALLBACK_CONTEXT = 2048  # tokens, where neither the model nor the tokenizer says


class Supervising:
    """Run the supervised stage once, when its trajectories are there; publish its result."""

    def __init__(self, state: LoopState, weights: Weights, publishing: Publishing) -> None:
        self.state = state
        self.weights = weights
        self.publishing = publishing
        self.done: bool | None = None  # None: the store not asked yet
        self.renderer: Renderer | None = None
        self.tried: list[str] = []  # the sources last rendered without a sample

    def pending(self) -> bool:
        """Whether the stage is still to run (before any GRPO step)."""
        if self.state.config.supervised_steps <= 0 or self.state.tenant is not None:
            return False
        if self.done is None:
            with self.state.engine.connect() as conn:
                self.done = ran_before(conn)
            if self.done:
                log.info("the supervised stage ran before (a step records it): GRPO goes on")
        return not self.done

    def maybe_train(self) -> bool:
        """The stage, once --supervised-batch source trajectories are there."""
        config = self.state.config
        ids = self._sources()
        if len(ids) < config.supervised_batch or ids == self.tried:
            self.state.activity = (
                f"supervised stage: waiting for {config.supervised_batch} trajectories "
                f"({config.supervised_from}: {len(ids)}, {len(self.tried)} unrenderable)"
            )
            return False
        samples, dropped = self._samples(ids)
        if not samples:
            self.tried = ids  # rendered again only once the sources change
            log.warning(
                "supervised stage: none of %d trajectories renders for the student: %s",
                len(ids),
                _reasons(dropped),
            )
            return False
        metrics = self._train(samples)
        metrics.update(
            supervised_trajectories=len(ids),
            supervised_dropped=dict(dropped),
            supervised_from=config.supervised_from,
        )
        self._publish(metrics, dropped)
        return True

    def _sources(self) -> list[str]:
        config = self.state.config
        # one pass of the stage's steps over distinct trajectories at most
        limit = config.supervised_batch * config.supervised_steps
        with self.state.engine.connect() as conn:
            if config.supervised_from == "teacher":
                return supervised_sources.teacher_answered(conn, limit=limit, keys=config.keys)
            return supervised_sources.passed(
                conn, min_reward=config.supervised_min_reward, limit=limit, keys=config.keys
            )

    def _samples(self, ids: list[str]) -> tuple[list[Sample], Counter[str]]:
        """The sources rendered for the student; the rest counted by reason."""
        trajectories = list(load_trajectories(self.state.engine, ids=ids))
        dropped: Counter[str] = Counter()
        if self.state.config.supervised_from == "teacher":
            # the rendered conversation ends with the last reply: it must be the teacher's
            kept = []
            for trajectory in trajectories:
                call = last_answered(trajectory)
                if call is not None and call.teacher is None:
                    dropped["last reply not the teacher's"] += 1
                else:
                    kept.append(trajectory)
            trajectories = kept
        samples, refused = self._renderer().render_all(trajectories)
        return samples, dropped + refused

    def _renderer(self) -> Renderer:
        if self.renderer is None:
            from transformers import AutoTokenizer

            # the served model's own template and tokenizer: what vLLM renders with
            tokenizer = AutoTokenizer.from_pretrained(str(self.state.model_dir))
            trainer = self.state.lineage.trainer
            self.renderer = Renderer(tokenizer, context_limit(trainer, tokenizer))
        return self.renderer

    def _train(self, samples: list[Sample]) -> JsonObject:
        """The stage's steps, each on the next --supervised-batch samples (shuffled once,
        taken in turn); AdamW's moments dropped after it: GRPO's loss is another."""
        state, config = self.state, self.state.config
        trainer = state.lineage.trainer
        assert trainer is not None
        started = time.monotonic()
        order = list(samples)
        random.Random(0).shuffle(order)
        batch = min(config.supervised_batch, len(order))
        trainer.set_learning_rate(config.supervised_learning_rate)
        state.lineage.trainer_is_serving = False  # until a record says what it holds
        losses: list[float] = []
        tokens = 0
        for k in range(config.supervised_steps):
            state.activity = f"supervised step {k + 1} of {config.supervised_steps}"
            taken = [order[(k * batch + j) % len(order)] for j in range(batch)]
            with state.time_slice.training():  # the replicas on this host paused meanwhile
                step = trainer.supervised_step(taken)
            losses.append(_number(step.get("loss")))
            tokens += int(_number(step.get("trained_tokens")))
            if (k + 1) % max(1, config.supervised_steps // 10) == 0:
                log.info("supervised step %d: loss %.4f", k + 1, losses[-1])
        trainer.optimizer.state.clear()
        trainer.set_learning_rate(config.learning_rate)
        return {
            "stage": STAGE,
            "supervised_steps": config.supervised_steps,
            "samples": len(samples),
            "trained_tokens": tokens,
            "loss_first": losses[0],
            "loss": losses[-1],
            "learning_rate": config.supervised_learning_rate,
            "step_seconds": round(time.monotonic() - started, 3),
        }

    def _publish(self, metrics: JsonObject, dropped: Counter[str]) -> None:
        """The stage's weights, published and verified as any step's; recorded as a step."""
        state, lineage = self.state, self.state.lineage
        step = state.step + 1
        try:
            result = self.publishing.publish_step(step, metrics, [], lineage.baselines)
        except BaseException:
            if state.step < step:
                self.weights.reload()  # no record says it trained: it runs again
            raise
        finally:
            state.last_step_end = time.monotonic()
        if result is None:
            return  # an operator changed what serves meanwhile: the stage runs again
        state.reporter.step(step, {**metrics, "published": result.ok})
        if not result.ok:
            return  # the version failed verification: the stage runs again
        self.done = True
        log.info(
            "supervised stage (step %d): %d steps on %d samples of %d %s trajectories "
            "(dropped: %s), loss %.4f -> %.4f; swap verified: %d weight sums exact, probe "
            "within %.3g -> %s",
            step,
            metrics["supervised_steps"],
            metrics["samples"],
            metrics["supervised_trajectories"],
            metrics["supervised_from"],
            _reasons(dropped),
            metrics["loss_first"],
            metrics["loss"],
            result.weight_sums_compared,
            result.max_logprob_diff if result.max_logprob_diff is not None else float("nan"),
            result.version,
        )


def ran_before(conn: Any) -> bool:
    """Whether a published step of this database was the supervised stage's."""
    recorded = training_steps.metrics_by_version(conn)
    return any(v is not None and (m or {}).get("stage") == STAGE for v, m in recorded.items())


def context_limit(trainer: Any, tokenizer: Any) -> int:
    """The most tokens a sample may have: the model's positions, else the tokenizer's."""
    config = getattr(getattr(trainer, "model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        return positions
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else FALLBACK_CONTEXT


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _reasons(dropped: Counter[str]) -> str:
    return ", ".join(f"{n} {why}" for why, n in dropped.most_common()) or "none"
