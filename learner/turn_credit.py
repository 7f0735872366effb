"""Per-turn credit (`learn --credit turn`): each reply trained on its own next-turn signal.

A trajectory's reward spreads one advantage over every reply, so a session where one reply
was corrected pushes its good replies down with it. With per-turn credit, a reply that a
next-turn signal judged (store/next_turn.py: a failed tool call, a correction, an approval,
...) gets the advantage ``value - baseline``, where the baseline is the mean signal of the
replies of its interaction type in the batch (a reply nothing judged counts 0 there: the
type's usual reply is neither). The replies nothing judged are not trained at all: no
tokens of theirs carry loss. Which trajectories a step takes is still decided by grouping
(learner/grouping.py) on their rewards; per-turn credit changes what their tokens learn.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from learner.signals import signals_in
from store.samples import Sample


def turn_values(detail: Mapping[str, Any] | None) -> dict[str, float]:
    """The weighed next-turn signal of each judged reply (call id -> value x weight) in a
    grade's detail; a signal of weight 0 (its key's signals are off) credits nothing."""
    return {s.call_id: s.value * s.weight for s in signals_in(detail) or [] if s.weight > 0}


def turn_advantages(
    replies: Mapping[str, list[str]],
    values: Mapping[str, dict[str, float]],
    types: Mapping[str, str | None],
) -> dict[str, dict[str, float]]:
    """Per trajectory, the advantage of each judged reply.

    replies: trajectory id -> its replies' call ids; values: trajectory id -> call id ->
    signal; types: trajectory id -> interaction type. A trajectory without a judged reply
    gets an empty mapping (nothing of it trains).
    """
    by_type: dict[str | None, list[float]] = defaultdict(list)
    for trajectory, calls in replies.items():
        judged = values.get(trajectory, {})
        by_type[types.get(trajectory)] += [judged.get(c, 0.0) for c in calls]
    baseline = {t: statistics.fmean(v) for t, v in by_type.items() if v}
    return {
        trajectory: {
            call: value - baseline[types.get(trajectory)]
            for call, value in values.get(trajectory, {}).items()
            if call in calls
        }
        for trajectory, calls in replies.items()
    }


def credited(sample: Sample, advantages: Mapping[str, float]) -> Sample:
    """The sample with each completion carrying its call's advantage and the completions of
    calls without one masked out (their tokens carry no loss)."""
    mask = [False] * len(sample.token_ids)
    per_token = [0.0] * len(sample.token_ids)
    for (start, end), call in zip(sample.completions, sample.call_ids, strict=True):
        if call not in advantages:
            continue
        for position in range(start, end):
            mask[position] = sample.loss_mask[position]
            per_token[position] = advantages[call]
    return replace(sample, loss_mask=mask, token_advantages=per_token)
