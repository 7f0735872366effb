"""A step: the graded batch, its advantages and bound, one optimizer step on its exact tokens,
the step line; and following what an operator, the guard or a canary made serve.

While a canary runs for the lineage's scope, the learner's or one an operator started, the
lineage trains no step: a version published meanwhile would change what serves under the
comparison, and one trained from an undecided candidate could descend from a version that
is rolled back. What is graded meanwhile, on both arms, waits for the step after the
decision, which trains from the candidate where it was promoted, else from what served."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass

import torch

from learner import step_size
from learner.accounting import StepAccount
from learner.cannot_learn import mostly_truncated, no_signal, slow_to_finish
from learner.grouping import (
    Advantaged,
    Baselines,
    Scored,
    bound_batch,
    compute_advantages,
    group_name,
    shuffle_rewards,
)
from learner.hindsight import Distilled, HintFrame, corrections, distilled
from learner.loop.guarding import Guarding
from learner.loop.publish import Publishing
from learner.loop.state import LoopState, save_baselines
from learner.loop.weights import Weights
from learner.signals import signals_in
from learner.step_time import StepTime, median_seconds, training_metrics
from learner.swap.publisher import PublishResult
from learner.time_slice import TimeSlice
from learner.turn_credit import credited, turn_advantages, turn_values
from store import canaries, clock, grade_queue, policy_versions, turn_signals
from store.grade_queue import TrainableGrade
from store.json_types import JsonObject
from store.samples import Sample, build_samples
from store.trajectory_loading import load_trajectories
from store.trajectory_record import Trajectory

log = logging.getLogger("onthejob.learner")


@dataclass
class StepBatch:
    """What a step trains on: (sample, advantage) pairs, the calls left out (by reason),
    hindsight's figures, and the warning when most replies were cut."""

    pairs: list[tuple[Sample, float]]
    skipped: Counter[str]
    hindsight: Distilled | None
    truncation: str | None


class Stepping:
    """Train one step of the lineage when a batch is ready, publish it, have it judged."""

    def __init__(
        self, state: LoopState, weights: Weights, publishing: Publishing, guarding: Guarding
    ) -> None:
        self.state = state
        self.weights = weights
        self.publishing = publishing
        self.guarding = guarding

    def follow_operator(self) -> None:
        """`onthejob rollback`, or the decision of the lineage's canary, may have changed
        what serves: train on from there. Once no canary runs for the scope, a full-weight
        candidate's replicas serve what the others do again (also where an earlier try was
        cut short, say by the store going away)."""
        lineage = self.state.lineage
        assert lineage.serving is not None
        with self.state.engine.connect() as conn:
            serving = policy_versions.serving_version(conn, lineage.tenant)
            running = canaries.running_for(conn, lineage.tenant)
        if lineage.canary is not None and running != lineage.canary:
            self._canary_decided(serving)
        elif serving is not None and serving["version"] != lineage.serving["version"]:
            self.weights.follow(serving)
        if running is None:
            self.publishing.withdraw_candidate()

    def _canary_decided(self, serving: policy_versions.PolicyVersionRow | None) -> None:
        """The trainer held the candidate: promoted, it trains on from what serves now (the
        candidate, or its weights under the swap's name); rolled back, from what served,
        which a full-weight candidate's replicas serve again."""
        lineage = self.state.lineage
        assert lineage.serving is not None
        canary, lineage.canary = lineage.canary, None
        if serving is not None and serving["version"] != lineage.serving["version"]:
            self.weights.follow(serving, by=f"canary {canary}'s promotion")
            return
        log.info(
            "canary %s rolled back: training from %s again", canary, lineage.serving["version"]
        )
        self.weights.reload()

    def _waits_for_canary(self) -> bool:
        """Whether a canary runs for the lineage's scope: then no step (see the module)."""
        lineage = self.state.lineage
        with self.state.engine.connect() as conn:
            running = canaries.running_for(conn, lineage.tenant)
        if running is None:
            return False
        scope = "the shared policy" if lineage.tenant is None else f"tenant {lineage.tenant}"
        self.state.activity = f"no step of {scope} while canary {running} runs"
        self._not_ready()
        return True

    def maybe_train(self) -> bool:
        state, lineage = self.state, self.state.lineage
        self.follow_operator()
        if self._waits_for_canary():
            return False
        rows, ordinals = self._trainable_rows()
        if not rows:
            self._not_ready()
            return False
        assert lineage.serving is not None
        current = ordinals.get(lineage.serving["version"], int(lineage.serving["ordinal"]))
        scored, unknown = self._scored(rows, ordinals)
        # on a copy: the same rows come back at every poll until a step consumes them, and
        # the learner takes the copy only once a record says so (a step tried again after a
        # fault must not fold its rewards in twice)
        baselines, advantaged, group_metrics = self._advantages(scored, current)
        if len(advantaged) < state.config.batch_trajectories:
            self._say_if_no_signal(scored, len(advantaged))
            self._not_ready()
            return False
        version_of = {s.trajectory_id: s.version_index for s in scored}
        fresh = sum(version_of[a.trajectory_id] == current for a in advantaged)
        if self._waits(fresh):
            return False
        fresh_waited = lineage.fresh.took()
        waited = lineage.traffic.took()
        since_last = time.monotonic() - state.last_step_end
        # at most max_batch_trajectories with a signal: the newest whole groups; the others
        # stay untrained (not considered, not marked) for a later step, or to grow stale
        scored, waiting = bound_batch(
            scored,
            advantaged,
            limit=self._batch_limit(),
            oldest=current - state.grouping.max_staleness,
        )
        if waiting:
            # the batch's advantages and baselines without what waits: the step that takes
            # it folds its rewards in
            baselines, advantaged, group_metrics = self._advantages(scored, current)
        # the step also accounts for what was too stale to grade (read only when a step will
        # happen: this runs at every poll)
        with state.engine.connect() as conn:
            stale = grade_queue.stale_skipped(conn, keys=state.config.keys)
        group_metrics["stale_not_graded"] = float(len(stale))
        group_metrics["yield_seconds"] = round(waited, 2)
        group_metrics["fresh_wait_seconds"] = round(fresh_waited, 2)
        group_metrics["gathering_seconds"] = round(max(0.0, since_last - fresh_waited - waited), 2)
        group_metrics.update(_lags(rows, advantaged))
        group_metrics["dropped_unknown_version"] = float(len(unknown))
        # how many versions behind the serving one the trained samples were sampled
        ages = [current - version_of[a.trajectory_id] for a in advantaged]
        group_metrics["staleness_mean"] = sum(ages) / len(ages) if ages else 0.0
        group_metrics["staleness_max"] = float(max(ages, default=0))
        considered = [s.trajectory_id for s in scored] + unknown + stale
        if state.config.hindsight > 0:
            # what a correction says trains a reply also where its group's rewards are flat
            advantaged = advantaged + self._corrected_only(scored, advantaged, current)
        self._train(advantaged, considered, group_metrics, baselines, waiting=len(waiting))
        return True

    def _trainable_rows(self) -> tuple[list[TrainableGrade], dict[str, int]]:
        """The graded trajectories a step may take (whole groups only), and the lineage's
        version ordinals."""
        with self.state.engine.connect() as conn:
            waiting = grade_queue.incomplete_groups(conn)
            trainable = grade_queue.trainable_grades(
                conn, keys=self.state.config.keys, tenant=self.state.tenant
            )
            rows = [r for r in trainable if r["group_key"] not in waiting]
            ordinals = (
                policy_versions.version_ordinals(conn)
                if self.state.tenant is None
                else policy_versions.lineage_ordinals(conn, self.state.tenant)
            )
        return rows, ordinals

    def _scored(
        self, rows: list[TrainableGrade], ordinals: dict[str, int]
    ) -> tuple[list[Scored], list[str]]:
        """The rows as rewards to group, and the ids of those no verified version answered:
        traffic of an unknown label, or recorded before the proxy knew the version, is not
        trainable, since nothing says which weights produced it."""
        unknown = [r["trajectory_id"] for r in rows if r["policy_version"] not in ordinals]
        scored = [
            Scored(
                trajectory_id=r["trajectory_id"],
                task_key=r["task_key"] or r["trajectory_id"],
                reward=float(r["reward"]),
                version_index=ordinals[r["policy_version"]],
                group_id=r["group_key"],
                interaction_type=r["interaction_type"],
            )
            for r in rows
            if r["policy_version"] in ordinals
        ]
        if self.state.config.shuffle_rewards:
            scored = shuffle_rewards(scored)
        return scored, unknown

    def _waits(self, fresh: int) -> bool:
        """Whether a ready step waits: for the serving version's own samples (`fresh` of
        them carry a signal), or for the replicas to go idle."""
        state, lineage = self.state, self.state.lineage
        if lineage.fresh.should_wait(fresh >= state.config.batch_trajectories):
            # the serving version is answering: train on its own samples, not on the
            # older ones answered while the last step trained
            state.activity = (
                f"step ready, waiting for the serving version's samples ({fresh} of "
                f"{state.config.batch_trajectories} with a signal, "
                f"{lineage.fresh.waited():.0f}s of {state.config.fresh_wait:g}s)"
            )
            return True
        if lineage.traffic.should_wait():
            # vLLM is generating on the cores (or GPU) the step would take: grade on, and
            # train on everything graded meanwhile once it is idle
            state.activity = (
                f"step ready, waiting for idle replicas ({lineage.traffic.busy:g} requests, "
                f"{lineage.traffic.waited():.0f}s of {state.config.yield_to_traffic:g}s)"
            )
            return True
        return False

    def _say_if_no_signal(self, scored: list[Scored], with_signal: int) -> None:
        """Before the first step: say once, with the fix, when the graded trajectories carry
        no signal at all (no step would ever be ready, so no step line would say it)."""
        state = self.state
        if state.step > 0 or state.said_no_signal:
            return
        why = no_signal(
            [s.reward for s in scored],
            with_signal=with_signal,
            batch=state.config.batch_trajectories,
        )
        if why is not None:
            log.warning("%s", why)
            state.activity = why
            state.said_no_signal = True

    def _not_ready(self) -> None:
        """No step is ready: the waits of the next one that is start anew."""
        lineage = self.state.lineage
        lineage.fresh.reset()
        lineage.traffic.reset()

    def _advantages(
        self, scored: list[Scored], current: int
    ) -> tuple[Baselines, list[Advantaged], dict[str, float]]:
        """Advantages and grouping metrics of `scored`, with a copy of the baselines that
        has their rewards folded in."""
        baselines = self.state.lineage.baselines.copy()
        advantaged, group_metrics = compute_advantages(
            scored,
            current_version_index=current,
            baselines=baselines.tasks,
            type_baselines=baselines.types,
            config=self.state.grouping,
        )
        return baselines, advantaged, dict(group_metrics)

    def _credit_turns(
        self,
        trajectories: list[Trajectory],
        samples: list[Sample],
        groups: dict[str, str],
        details: dict[str, JsonObject],
    ) -> list[Sample]:
        """The samples with per-turn advantages (learner/turn_credit.py): a reply trains on
        its own next-turn signal, a reply nothing judged not at all."""
        ids = [t.id for t in trajectories]
        per_turn = turn_advantages(
            replies={t.id: [c.id for c in t.calls if c.status == "ok"] for t in trajectories},
            values={i: turn_values(details.get(i)) for i in ids},
            types={t.id: t.interaction_type for t in trajectories},
            groups=groups,
        )
        return [credited(s, per_turn[s.trajectory_id]) for s in samples]

    def _corrections(
        self, ids: list[str], details: dict[str, JsonObject] | None = None
    ) -> dict[str, dict[str, str]]:
        """Per trajectory, the corrections people made of its replies: the signals in its
        grade (`details`, read here when not given), else those stored for it."""
        with self.state.engine.connect() as conn:
            if details is None:
                details = grade_queue.grade_details(conn, ids)
            graded = {t: signals_in(details.get(t)) for t in ids}
            stored = turn_signals.signals_by_trajectory(
                conn, [t for t, found in graded.items() if found is None]
            )
        return {
            t: corrections(found if found is not None else stored.get(t, []))
            for t, found in graded.items()
        }

    def _corrected_only(
        self, scored: list[Scored], advantaged: list[Advantaged], current: int
    ) -> list[Advantaged]:
        """The batch's fresh trajectories grouping gave no advantage (a flat group) that
        hold a correction: advantage 0, so hindsight is what they train on."""
        have = {a.trajectory_id for a in advantaged}
        oldest = current - self.state.grouping.max_staleness
        rest = [s for s in scored if s.trajectory_id not in have and s.version_index >= oldest]
        found = self._corrections([s.trajectory_id for s in rest])
        return [
            Advantaged(s.trajectory_id, 0.0, group_name(s)) for s in rest if found[s.trajectory_id]
        ]

    def _distil(
        self, pairs: list[tuple[Sample, float]], details: dict[str, JsonObject]
    ) -> tuple[list[tuple[Sample, float]], Distilled]:
        """The pairs with hindsight targets on the corrected replies (learner/hindsight.py)."""
        state, lineage = self.state, self.state.lineage
        assert lineage.trainer is not None
        stats = Distilled()
        frame = state.hint_frame
        if not isinstance(frame, HintFrame):
            return pairs, stats
        hints = self._corrections(list(details), details)
        coef = state.config.hindsight
        hinted = any(hints[sample.trajectory_id] for sample, _ in pairs)
        # the teacher's forward passes are the trainer's compute too: the replicas on this
        # host paused for them, as for the optimizer step
        with state.time_slice.training() if hinted else contextlib.nullcontext():
            out = [
                (
                    distilled(
                        sample, advantage, hints[sample.trajectory_id], frame,
                        lineage.trainer.logprobs_of, coef, stats,
                    ),
                    advantage,
                )
                for sample, advantage in pairs
            ]  # fmt: skip
        return out, stats

    def _batch_limit(self) -> int:
        """Trajectories with a signal a step trains on at most (0: no bound): never fewer
        than a step waits for (both are live knobs)."""
        bound = self.state.config.max_batch_trajectories
        return 0 if bound <= 0 else max(bound, self.state.config.batch_trajectories)

    def _train(
        self,
        advantaged: list[Advantaged],
        considered: list[str],
        group_metrics: dict[str, float],
        baselines: Baselines,
        *,
        waiting: int = 0,
    ) -> None:
        """One step on `advantaged`; `considered`: every trajectory it consumes (marked with
        the step); `waiting`: how many with a signal were left for a later step."""
        state, lineage = self.state, self.state.lineage
        assert lineage.trainer is not None and lineage.publisher is not None and lineage.serving
        account = StepAccount.of_grouping(
            group_metrics, considered=len(considered), waiting=waiting
        )
        batch = self._build_batch(advantaged, account)
        step = state.step + 1
        metrics, training_cpu, threads = self._optimize(step, batch)
        account.trained(metrics)
        metrics.update(
            group_metrics,
            learning_rate=state.config.learning_rate,
            skipped_calls=dict(batch.skipped),
            **account.metrics(),
        )
        # one assignment: the heartbeat thread reads it
        state.last_batch = {
            "step": step,
            "trained": not metrics.get("skipped"),
            **account.metrics(),
        }
        if metrics.get("skipped"):
            self._nothing_trained(considered, baselines, account, batch.truncation)
            return
        if account.low:
            log.warning("step %d %s", step, account.warning())
        try:
            result = self.publishing.publish_step(step, metrics, considered, baselines)
        except BaseException:
            if state.step < step:
                # the optimizer stepped, but no record says so: back to the serving weights,
                # so the step is neither lost nor done twice (its batch is trained again)
                self.weights.reload()
            raise
        finally:
            state.last_step_end = time.monotonic()
        if result is None:
            return  # an operator changed what serves meanwhile: trained again from there
        times = _step_time(group_metrics, metrics, training_cpu, threads, result.swap_seconds)
        metrics.update(times.metrics())
        self._log_step(step, account, metrics, times, result, batch.truncation)
        state.reporter.step(step, {**metrics, "published": result.ok})
        # the guard judges a version that serves its scope; a canary's candidate, its canary
        if result.ok and lineage.guard is not None and lineage.canary is None:
            self.guarding.check(step)

    def _build_batch(self, advantaged: list[Advantaged], account: StepAccount) -> StepBatch:
        """The samples of the advantaged trajectories the trainer can take, with their
        advantages (per-turn credit and hindsight applied), and what was left out, why."""
        state, lineage = self.state, self.state.lineage
        assert lineage.trainer is not None
        advantage_of = {a.trajectory_id: a.advantage for a in advantaged}
        trajectories = list(load_trajectories(state.engine, ids=list(advantage_of)))
        samples: list[Sample] = []
        advantages: list[float] = []
        skipped: Counter[str] = Counter()  # calls not trained on, by reason
        for trajectory in trajectories:
            for sample in build_samples(trajectory, skipped=skipped):
                samples.append(sample)
                advantages.append(advantage_of[trajectory.id])
        details: dict[str, JsonObject] = {}
        if state.config.turn_credit or state.config.hindsight > 0:
            # what per-turn credit and hindsight read: the batch's grades, read once
            with state.engine.connect() as conn:
                details = grade_queue.grade_details(conn, [t.id for t in trajectories])
        if state.config.turn_credit:
            groups = {a.trajectory_id: a.group for a in advantaged}
            samples = self._credit_turns(trajectories, samples, groups, details)
        pairs: list[tuple[Sample, float]] = []
        left_out: Counter[str] = Counter()  # samples the trainer is not given, by reason
        for sample, advantage in zip(samples, advantages, strict=True):
            why = lineage.trainer.untrainable(sample)
            if why is None:
                pairs.append((sample, advantage))
            else:
                left_out[why] += 1
        hindsight = None
        if state.config.hindsight > 0:
            pairs, hindsight = self._distil(pairs, details)
        account.built(
            calls_skipped=skipped,
            samples=len(samples),
            dropped=left_out,
            trajectories=len({s.trajectory_id for s, _ in pairs}),
        )
        truncation = mostly_truncated(sum(s.truncated for s in samples), len(samples))
        return StepBatch(pairs, skipped, hindsight, truncation)

    def _measured_from(self, serving: policy_versions.PolicyVersionRow) -> dict[str, float]:
        """The versions whose samples in the batch measure the last step, with its share of
        their KL: ``serving``'s ancestors while GRPO steps of this lineage led from them,
        --max-staleness back at most (older samples are dropped as stale)."""
        chain = [serving]
        tenant = self.state.tenant
        with self.state.engine.connect() as conn:
            while len(chain) <= self.state.grouping.max_staleness:
                child = chain[-1]
                if child["parent"] is None or step_size.recorded_scale(child, tenant) is None:
                    break
                parent = policy_versions.version(conn, version=child["parent"])
                if parent is None:
                    break
                chain.append(parent)
        return step_size.measured_from(chain, tenant)

    def _optimize(self, step: int, batch: StepBatch) -> tuple[JsonObject, float, int]:
        """The optimizer step on the batch: its metrics, the trainer's CPU seconds and
        threads (how much of the cores it had)."""
        assert self.state.lineage.trainer is not None and self.state.lineage.serving is not None
        self.state.activity = f"training step {step}"
        # the knob as the operator or the command line last set it, whatever the optimizer
        # state loaded from a checkpoint says
        self.state.lineage.trainer.set_learning_rate(self.state.config.learning_rate)
        self.state.lineage.trainer_is_serving = False  # until a record says what it holds
        # the replicas on this host paused while the trainer computes, where it has work
        serving = self.state.lineage.serving
        # a version a GRPO step published records the scale it took (the next goes on from
        # it); the samples of its ancestors say how far that step moved the policy
        measured = self._measured_from(serving)
        recorded = step_size.recorded_scale(serving, self.state.tenant)
        computes = self.state.time_slice if batch.pairs else TimeSlice([], 0)
        with computes.training() as paused:
            cpu_before = time.process_time()
            metrics = self.state.lineage.trainer.step(
                [s for s, _ in batch.pairs],
                [a for _, a in batch.pairs],
                fresh_version=serving["version"],
                previous_versions=measured or None,
                previous_scale=recorded,
            )
            training_cpu = time.process_time() - cpu_before
            threads = torch.get_num_threads()
        if paused:
            metrics["replicas_paused"] = len(paused)
        metrics.update(
            training_metrics(float(metrics.get("step_seconds", 0.0)), training_cpu, threads)
        )
        if batch.hindsight is not None:
            metrics.update(batch.hindsight.metrics())
            log.info(
                "step %d hindsight: %d corrected replies, %d tokens, mean gap %+.3f nats "
                "(%d without a place for the hint)",
                step,
                batch.hindsight.replies,
                batch.hindsight.tokens,
                metrics["hindsight_gap_mean"],
                batch.hindsight.unplaced,
            )
        return metrics, training_cpu, threads

    def _nothing_trained(
        self,
        considered: list[str],
        baselines: Baselines,
        account: StepAccount,
        truncation: str | None,
    ) -> None:
        """Nothing trainable (all truncated, without captured tokens, or mismatched): no new
        version, and no optimizer step; the batch is marked as consumed."""
        state, lineage = self.state, self.state.lineage
        lineage.trainer_is_serving = True
        with state.engine.begin() as conn:
            grade_queue.mark_trained(conn, trajectory_ids=considered, step=-1)
            save_baselines(conn, baselines)
        lineage.baselines = baselines
        state.last_step_end = time.monotonic()
        log.warning(
            "batch of %d trajectories had nothing to train on: %s%s",
            len(considered),
            account.summary(),
            f"; {truncation}" if truncation else "",
        )

    def _log_step(
        self,
        step: int,
        account: StepAccount,
        metrics: JsonObject,
        times: StepTime,
        result: PublishResult,
        truncation: str | None,
    ) -> None:
        """The step's line: what it trained on, how the update went, where the time went,
        how the swap was verified, and what stands in the way of learning."""
        warnings = "".join(
            f"; {w}" for w in (truncation, slow_to_finish(times.grading_lag)) if w is not None
        )
        log.info(
            "step %d: %s; %d tokens, reward %.3f, %s, loss %.4f, clip %.3f "
            "(behaviour %.3f), ratio %.4f [%.4f, %.4f], mismatch-kl %.2e (fresh %.2e over %d "
            "tokens); %s (optimizer state %.1fs); swap verified: %d weight sums exact, probe "
            "within %.3g%s -> %s",
            step,
            account.summary(),
            int(metrics.get("trained_tokens", 0)),
            metrics.get("mean_reward", float("nan")),
            step_size.describe(
                float(metrics.get("learning_rate_used", self.state.config.learning_rate)),
                self.state.config.learning_rate,
                self.state.config.step_kl,
                metrics.get("movement_kl"),
            ),
            metrics.get("loss", float("nan")),
            metrics.get("clip_fraction", float("nan")),
            metrics.get("behaviour_clip_fraction", float("nan")),
            metrics.get("ratio_mean", float("nan")),
            metrics.get("ratio_min", float("nan")),
            metrics.get("ratio_max", float("nan")),
            metrics.get("mismatch_kl", float("nan")),
            metrics.get("fresh_mismatch_kl", float("nan")),
            int(metrics.get("fresh_tokens", 0)),
            times.summary(),
            metrics.get("optimizer_state_seconds", float("nan")),
            result.weight_sums_compared,
            result.max_logprob_diff if result.max_logprob_diff is not None else float("nan"),
            warnings,
            _published(result, self.state.lineage.canary),
        )


def _published(result: PublishResult, canary: int | None) -> str:
    """The step line's end: the version it published (as a canary's candidate), or why not."""
    if not result.ok:
        return f"NOT PUBLISHED ({result.error})"
    return result.version if canary is None else f"{result.version} (canary {canary})"


def _step_time(
    group_metrics: dict[str, float],
    metrics: JsonObject,
    training_cpu: float,
    threads: int,
    swap_seconds: float,
) -> StepTime:
    """Where the time since the last step went, from what gathering and the step measured."""
    return StepTime(
        gathering=group_metrics.get("gathering_seconds", 0.0),
        fresh_wait=group_metrics.get("fresh_wait_seconds", 0.0),
        yield_wait=group_metrics.get("yield_seconds", 0.0),
        training=float(metrics.get("step_seconds", 0.0)),
        training_cpu=training_cpu,
        threads=threads,
        saving=float(metrics.get("save_seconds", 0.0)),
        swap=swap_seconds,
        grading_lag=group_metrics.get("grading_lag_seconds"),
        sample_age=group_metrics.get("sample_age_seconds"),
        paused=int(metrics.get("replicas_paused", 0)),
    )


def _lags(rows: list[TrainableGrade], advantaged: list[Advantaged]) -> dict[str, float]:
    """The median grading lag (last call -> graded) and sample age (started -> now) of the
    trajectories a step trains on, in seconds (absent where unknown)."""
    row_of = {r["trajectory_id"]: r for r in rows}
    trained = [row_of[a.trajectory_id] for a in advantaged]
    now = clock.now()
    lags = {
        "grading_lag_seconds": median_seconds(
            [(r.get("last_call_at"), r.get("graded_at")) for r in trained]
        ),
        "sample_age_seconds": median_seconds(
            [(clock.as_utc(r.get("started_at")), now) for r in trained]
        ),
    }
    return {k: round(v, 2) for k, v in lags.items() if v is not None}
