"""What the learner decides about a running canary, from its arms' stats (store/canary_stats.py).

Each measure is compared with the always-valid test of learner/canary/sequential.py, at a
third of 5% each, so the learner may look after every grading pass and still decide between
arms that do not differ at most 5% of the time:

- **reward** (higher is better): the graded trajectories' rewards;
- **errors** (lower is better): the share of calls that failed;
- **complaints** (lower is better): negative next-turn signals (corrections, retries, tool
  errors) per call, each call counted as complained about or not.

The candidate is rolled back as soon as it is worse on any measure: a reward that rises while
complaints or errors rise is the first sign of a policy that pleases its grader and not its
users, so a better reward never outweighs them. It is promoted once its reward is better and
nothing is worse. Neither before each arm has `min_calls` calls. At the time limit the
canary's default decision is taken. Latency is shown with the arms but not tested: the store
keeps its mean, not its spread.

The reward-hacking watch (learner/canary/watch.py) holds a promotion: while any of its
detectors alerts on the candidate, a candidate the test would promote is held (`hold`: it
goes on collecting, so an alert that was noise can clear), and at the time limit a held
candidate, or one whose default decision is to promote, is rolled back instead. The watch
never holds a rollback, and an operator may still promote by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from learner.canary.sequential import Arm, Comparison, Rule, Verdict
from learner.canary.watch import Alert
from store.canaries import CanaryRow
from store.canary_stats import ArmStats, CanaryArms

Action = Literal["promote", "rollback", "hold"]
# three measures, each at a third of 5%: alike arms get a verdict at most 5% of the time
ALPHA_EACH = 0.05 / 3


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


@dataclass(frozen=True)
class Measures:
    """The rule of each measure; `min_samples` is raised to the canary's `min_calls`."""

    reward: Rule = field(default_factory=lambda: Rule(True, alpha=ALPHA_EACH, tau=0.1))
    errors: Rule = field(default_factory=lambda: Rule(False, alpha=ALPHA_EACH, tau=0.05))
    complaints: Rule = field(default_factory=lambda: Rule(False, alpha=ALPHA_EACH, tau=0.05))


def comparisons(
    arms: CanaryArms, *, min_calls: int, measures: Measures | None = None
) -> dict[str, Comparison]:
    """Each measure's comparison of the candidate's arm with the incumbent's."""
    measures = measures or Measures()

    def rule(base: Rule) -> Rule:
        return Rule(
            higher_is_better=base.higher_is_better,
            alpha=base.alpha,
            tau=base.tau,
            min_samples=max(base.min_samples, min_calls, 2),
            min_variance=base.min_variance,
        )

    def compare(base: Rule, of: Any) -> Comparison:
        return Comparison.from_arms(rule(base), of(arms["candidate"]), of(arms["incumbent"]))

    return {
        "reward": compare(
            measures.reward,
            lambda a: Arm.from_sums(a["graded"], a["reward_sum"], a["reward_squares"]),
        ),
        # a 0/1 value per call: its sum and its sum of squares are the count
        "errors": compare(
            measures.errors, lambda a: Arm.from_sums(a["calls"], a["errors"], a["errors"])
        ),
        "complaints": compare(measures.complaints, _complained),
    }


def _complained(arm: ArmStats) -> Arm:
    complained = min(arm["signals"]["negative"], arm["calls"])
    return Arm.from_sums(arm["calls"], complained, complained)


def decide(
    canary: CanaryRow,
    arms: CanaryArms,
    *,
    now: datetime,
    measures: Measures | None = None,
    alerts: Sequence[Alert] = (),
) -> Decision | None:
    """Promote, roll back, hold (a promotion the watch's `alerts` stop), or None: go on
    collecting. `canary` as store.canaries gives it."""
    found = comparisons(arms, min_calls=canary["min_calls"], measures=measures)
    worse = [name for name, c in found.items() if c.verdict() is Verdict.WORSE]
    if worse:
        said = "; ".join(f"{name}: {found[name].summary()}" for name in worse)
        return Decision("rollback", f"the candidate is worse on {', '.join(worse)} ({said})")
    better = found["reward"].verdict() is Verdict.BETTER
    reward = found["reward"].summary()
    if better and not alerts:
        return Decision("promote", f"the candidate's reward is better ({reward})")
    held = f"the watch alerts: {watch_reasons(alerts)}"
    if now >= canary["ends_at"]:
        if alerts and (better or canary["default_decision"] == "promote"):
            return Decision(
                "rollback",
                f"the time limit passed while the watch held its promotion ({held}; "
                f"reward: {reward})",
            )
        return Decision(
            canary["default_decision"],
            f"the time limit passed without a verdict; its default decision (reward: {reward})",
        )
    if better:
        return Decision("hold", f"the candidate's reward is better ({reward}), but {held}")
    return None


def watch_reasons(alerts: Sequence[Alert]) -> str:
    """Each alert's reason, named by its detector where the reason does not start so."""
    return "; ".join(
        a.reason if a.reason.startswith(a.detector) else f"{a.detector}: {a.reason}" for a in alerts
    )
