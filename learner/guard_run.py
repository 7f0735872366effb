"""The regression guard at work: evaluate a version on every guarded type, decide, record.

The learner (`onthejob learn --guard FILE`) calls `Guard.check` right after a step's version
is published and serving: each guarded type's eval task set runs through the proxy with the
rollout runner in eval mode (learner/rollout/runner.py; the runs are filed in eval_results
under the task set `guard:TYPE`, as any eval), and learner/guard.py's rule decides. The
learner rolls a version the rule rejects back to the last kept one (learner/swap/versions.py).

What it keeps: store/guard_records.py. Invariant: a decision is recorded before the learner
acts on it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from sqlalchemy import Engine

from learner.guard import Decision, GuardConfig, GuardedType, Score, Waiver, config_state, decide
from learner.rollout.curriculum_runner import eval_metrics
from learner.rollout.runner import RolloutConfig, run_rollout
from store import learner_state
from store.guard_records import (
    CONFIG,
    EVALS,
    WAIVER,
    append_decision,
    now_iso,
    protected_overrides,
    recorded_types,
    trained_types,
)
from store.policy_versions import PolicyVersionRow

log = logging.getLogger("onthejob.guard")


class Guard:
    def __init__(
        self,
        config: GuardConfig,
        engine: Engine,
        database_url: str,
        *,
        activity: Callable[[str], None] = lambda _: None,
        tenant: str | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.database_url = database_url
        self.activity = activity
        # a tenant's guard (learn --tenants) judges that tenant's versions on its own evals,
        # run as the tenant (GuardConfig.for_tenant); its scores are kept apart from others'
        self.tenant = tenant
        # per guarded type: the interaction types its last eval's trajectories were recorded
        # as (the harness's header or fingerprint), to tell an operator whose guard entry is
        # not named after the type it is meant to guard
        self.recorded_as: dict[str, list[str]] = {}
        if tenant is None:
            publish_config(engine, config)

    # -- evals ----------------------------------------------------------------------------
    def score(self, guarded: GuardedType, version: str) -> Score | None:
        """One eval of `guarded` by `version` (the serving one): its runs that version
        served (an operator may have swapped meanwhile), None if there were none."""
        self.activity(f"guard: evaluating {version} on {guarded.name}{self._for()}")
        rollout = RolloutConfig(
            proxy_url=self.config.proxy_url,
            command=guarded.command,
            tasks=guarded.tasks,  # named guard:TYPE
            database_url=self.database_url,
            group_size=guarded.samples,
            concurrency=self.config.concurrency,
            timeout=guarded.timeout,
            eval=True,
            success_threshold=guarded.success_threshold,
            env=guarded.env,
        )
        summary = run_rollout(rollout)
        served = [t for r in summary.runs if r.policy_version == version for t in r.trajectory_ids]
        others = sorted({str(r.policy_version) for r in summary.runs} - {version})
        if others and self.tenant is not None:
            log.warning(
                "guard: eval runs of %r for tenant %s were answered by %s, not by %s: they do "
                "not count; run them as the tenant (its client key or type in "
                "[tenants.%s] env)",
                guarded.name,
                self.tenant,
                ", ".join(others),
                version,
                self.tenant,
            )
        self._note_recorded_types(guarded.name, served)
        rows = [r for r in summary.eval_rows if r["policy_version"] == version]
        metrics = eval_metrics(rows, k=guarded.samples)
        if not metrics["runs"] or metrics[guarded.metric] is None:
            return None
        return Score(float(metrics[guarded.metric]), int(metrics["runs"]))

    def _note_recorded_types(self, name: str, trajectory_ids: list[str]) -> None:
        with self.engine.connect() as conn:
            recorded = recorded_types(conn, trajectory_ids)
        if recorded and recorded != self.recorded_as.get(name) and name not in recorded:
            log.warning(
                "guard: the eval runs of %r were recorded as interaction type %s, not %r: "
                "name the guard entry after the type it guards (GET /admin/api/types), or "
                "let its harness send X-Onthejob-Type: %s",
                name,
                ", ".join(recorded),
                name,
                name,
            )
        self.recorded_as[name] = recorded

    def evaluate(self, version: PolicyVersionRow) -> dict[str, Score]:
        """Every guarded type by `version`, remembered for its checkpoint."""
        scores: dict[str, Score] = {}
        for guarded in self.config.types:
            score = self.score(guarded, version["version"])
            if score is not None:
                scores[guarded.name] = score
        state = {n: {"value": s.value, "runs": s.runs, "version": version["version"],
                     "at": now_iso()} for n, s in scores.items()}  # fmt: skip
        with self.engine.begin() as conn:
            evals = dict(learner_state.get_state(conn, EVALS) or {})
            evals[self._evals_key(version)] = state
            learner_state.set_state(conn, EVALS, evals)
        return scores

    def known(self, version: PolicyVersionRow) -> dict[str, Score] | None:
        with self.engine.connect() as conn:
            evals = learner_state.get_state(conn, EVALS) or {}
        state = evals.get(self._evals_key(version))
        if state is None:
            return None
        return {n: Score(float(s["value"]), int(s["runs"])) for n, s in state.items()}

    def _evals_key(self, version: PolicyVersionRow) -> str:
        """Scores are the weights' (a rollback serves the same ones under a new name), for
        the evals of the shared policy or of one tenant."""
        path = str(version["checkpoint_path"])
        return path if self.tenant is None else f"tenant:{self.tenant}:{path}"

    def _for(self) -> str:
        return "" if self.tenant is None else f" for tenant {self.tenant}"

    def baseline(self, version: PolicyVersionRow) -> dict[str, Score]:
        """The kept version's scores: remembered for its weights, else evaluated now."""
        known = self.known(version)
        if known is not None and set(known) >= {t.name for t in self.config.types}:
            return known
        log.info("guard: evaluating %s as the baseline%s", version["version"], self._for())
        return self.evaluate(version)

    # -- the decision -----------------------------------------------------------------------
    def check(
        self, candidate: PolicyVersionRow, kept: PolicyVersionRow, *, step: int | None = None
    ) -> Decision:
        """Evaluate the serving `candidate` against the last `kept` version, decide, and
        record the decision (the caller rolls back a rejected version)."""
        before = self.baseline(kept)
        after = self.evaluate(candidate)
        with self.engine.begin() as conn:
            waiver = Waiver.from_state(learner_state.get_state(conn, WAIVER))
            config = self._with_overrides(protected_overrides(conn))
            decision = decide(config, before, after, waiver)
            if waiver is not None:
                learner_state.set_state(conn, WAIVER, None)  # it was for this version only
            append_decision(
                conn,
                {
                    "version": candidate["version"],
                    "tenant": self.tenant,
                    "kept": kept["version"],
                    "step": step,
                    "outcome": decision.outcome,
                    "reason": decision.reason,
                    "trained_types": trained_types(conn, step),
                    "recorded_as": {
                        t.name: self.recorded_as.get(t.name, []) for t in self.config.types
                    },
                    "waiver": None if waiver is None else waiver.state(),
                    "types": [v.state() for v in decision.verdicts],
                    "at": now_iso(),
                },
            )
        log.info("guard: %s %s (%s)", candidate["version"], decision.outcome, decision.reason)
        for v in decision.verdicts:
            log.info(
                "guard: %s %s %s -> %s (allowed drop %s)",
                candidate["version"],
                v.type,
                _fmt(v.before),
                _fmt(v.after),
                "-" if v.allowed is None else f"{v.allowed:.3f}",
            )
        return decision

    def _with_overrides(self, overrides: dict[str, bool]) -> GuardConfig:
        types = [
            dataclasses.replace(t, protected=overrides[t.name]) if t.name in overrides else t
            for t in self.config.types
        ]
        return dataclasses.replace(self.config, types=types)


def publish_config(engine: Engine, config: GuardConfig) -> None:
    """What the guard checks, for the admin API and the dashboard."""
    with engine.begin() as conn:
        learner_state.set_state(conn, CONFIG, config_state(config))


def _fmt(score: Score | None) -> str:
    return "-" if score is None else f"{score.value:.3f} ({score.runs} runs)"
