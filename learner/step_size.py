"""How far one step may move the policy: the learning rate scaled to a KL target per step.

One learning rate does not suit every model. At lr 5e-5 a step of SmolLM2-135M moved the
policy about 5e-3 nats a token (the demo's step lines) and learned fast; a step of Gemma 3
270M moved it 0.4-0.6 nats a token, its samples a version behind were dropped as sequence
mismatches, and on arithmetic it collapsed within 6 steps into replies of "=====" (issue
42; docs/measurements/defaults.md). At 1e-5 Gemma moved 4e-3 to 6e-2 and learned.

So `--learning-rate` is the most a step takes, and `--step-kl` the movement aimed at. How
far the last step moved the policy is measured for free in the next one: the trainer
recomputes the logprobs of samples the previous version produced (the serving version's
parent), and their k3 estimate of KL against vLLM's recorded logprobs is that step's
movement (plus numerics, about 1e-3). Samples of older versions count too, with the last
step's share of their KL (`measured_from`: by the squares of the recorded scales of the
steps since; more KL where steps go the same way, so the share errs on the large side, the
rate on the small): under live traffic most trajectories finish a few versions after their
calls (a call answered without tool calls ends its trajectory 15 s later), and the
parent's alone measured 1 step in 22 (docs/measurements/defaults.md).

The scale follows KL ~ lr^2 (what Gemma showed between 1e-5 and 5e-5): scale *=
sqrt(target / movement), at most halved twice or doubled per step, never above 1 (the
learning rate given) nor below 1/64. A step whose batch holds no such samples leaves the
scale as it is.

The scale a step took is recorded with the version it publishes (`step_scale`), and the
next measure goes on from it: a restarted learner, or a trainer rebuilt after a failed
publish, does not go back to the full rate. A version's samples measure only where every
step after it was a GRPO step of the lineage; after a rollback, the supervised stage or on
the first step the scale goes on as it was (1 on a new learner: the first step takes the
full rate).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_SCALE = 1 / 64
MOST_SHRINK, MOST_GROWTH = 0.25, 2.0  # per step: one noisy measure never swings it far
MIN_TOKENS = 16  # fewer tokens of the previous version: no measure


@dataclass
class StepSize:
    """The learning rate's scale; ``target`` 0: off (the learning rate as given)."""

    target: float
    scale: float = 1.0
    last_movement: float | None = None  # nats a token, this step's measure (None: none)

    def follow(self, scale_then: float | None, k3_sum: float, tokens: int) -> None:
        """Go on from ``scale_then``, the scale the measured step took as recorded with the
        version it published (None: none recorded, this object's own scale), by that step's
        movement over ``tokens`` tokens of the version it trained from."""
        if scale_then is not None and math.isfinite(scale_then) and scale_then > 0:
            self.scale = min(1.0, max(MIN_SCALE, scale_then))
        self.observe(k3_sum, tokens)

    def observe(self, k3_sum: float, tokens: int) -> None:
        """The last step's movement over ``tokens`` tokens of the previous version."""
        self.last_movement = None
        if self.target <= 0 or tokens < MIN_TOKENS:
            return
        movement = k3_sum / tokens
        if not math.isfinite(movement):
            return
        self.last_movement = movement
        factor = math.sqrt(self.target / max(movement, 1e-12))
        factor = min(MOST_GROWTH, max(MOST_SHRINK, factor))
        self.scale = min(1.0, max(MIN_SCALE, self.scale * factor))

    def learning_rate(self, most: float) -> float:
        return most if self.target <= 0 else most * self.scale


def recorded_scale(version: Mapping[str, Any], tenant: str | None) -> float | None:
    """The scale a GRPO step of ``tenant``'s lineage took when it published ``version``
    (None: no such step published it)."""
    scale = (version.get("metrics") or {}).get("step_scale")
    if not isinstance(scale, int | float) or version.get("tenant") != tenant:
        return None
    return float(scale)


def measured_from(chain: Sequence[Mapping[str, Any]], tenant: str | None) -> dict[str, float]:
    """The versions whose samples measure how far the last step moved the policy, each with
    the share of its samples' KL that is that step's. ``chain``: the trainer's version, then
    its ancestors, nearest first. A version counts while every step after it was a GRPO
    step of ``tenant``'s lineage; the steps between moved it by their scales s_1 (the last)
    .. s_n, and KL adds up over steps as their squares (KL ~ lr^2; more where steps go the
    same way, so the share errs on the large side): the last step's share is s_1^2 / sum
    s_k^2. Not across a rollback, the supervised stage, or a tenant's start from the shared
    policy's ancestors."""
    found: dict[str, float] = {}
    last = squares = 0.0
    for child, parent in itertools.pairwise(chain):
        scale = recorded_scale(child, tenant)
        if scale is None:
            break
        last = last or scale**2  # the first child's: the last step's
        squares += scale**2
        found[str(parent["version"])] = last / squares
    return found


def describe(learning_rate_used: float, most: float, target: float, movement: float | None) -> str:
    """The step line's learning rate: what this step used, and why."""
    said = f"lr {learning_rate_used:.3g}"
    if target <= 0:
        return said
    scaled = (
        f"x{learning_rate_used / most:.2g} of {most:.3g}, " if learning_rate_used < most else ""
    )
    moved = (
        f"the last step moved the policy {movement:.2e} nats a token"
        if movement is not None
        else "no measure of the last step"
    )
    return f"{said} ({scaled}{moved}; --step-kl {target:g})"
