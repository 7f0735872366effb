"""Per-turn credit (`learn --credit turn`): each reply trained on its own next-turn signal.

A trajectory's reward spreads one advantage over every reply, so a session where one reply
was corrected pushes its good replies down with it. With per-turn credit, a reply that a
next-turn signal judged (store/next_turn.py: a failed tool call, a correction, an approval,
...) gets the advantage ``value - baseline``, where the baseline is the mean of the judged
replies of its GRPO group (the answers to one prompt), or, for a trajectory alone in its
group, the mean signal of the replies of its interaction type in the batch (a reply nothing
judged counts 0 there: the type's usual reply is neither). The replies nothing judged are
not trained at all: no
tokens of theirs carry loss. Which trajectories a step takes is still decided by grouping
(learner/grouping.py) on their rewards; per-turn credit changes what their tokens learn.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace

from learner.signals import signals_in
from store.json_types import JsonValue
from store.samples import Sample


def turn_values(detail: Mapping[str, JsonValue] | None) -> dict[str, float]:
    """The weighed next-turn signal of each judged reply (call id -> value x weight) in a
    grade's detail; a signal of weight 0 (its key's signals are off) credits nothing."""
    return {s.call_id: s.value * s.weight for s in signals_in(detail) or [] if s.weight > 0}


def turn_advantages(
    replies: Mapping[str, list[str]],
    values: Mapping[str, dict[str, float]],
    types: Mapping[str, str | None],
    groups: Mapping[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """Per trajectory, the advantage of each judged reply.

    replies: trajectory id -> its replies' call ids; values: trajectory id -> call id ->
    signal; types: trajectory id -> interaction type; groups: trajectory id -> its GRPO
    group (learner/grouping.py). A judged reply is compared with the mean of the judged
    replies of its group when the group has at least two trajectories with one (as GRPO
    compares answers to one prompt: a prompt's difficulty is not the reply's doing), else
    with the mean signal of its interaction type's replies in the batch, where a reply
    nothing judged counts 0 (the type's usual reply is neither good nor bad). A trajectory
    without a judged reply gets an empty mapping (nothing of it trains).
    """
    judged = {t: {c: v for c, v in values.get(t, {}).items() if c in calls}
              for t, calls in replies.items()}  # fmt: skip
    by_type: dict[str | None, list[float]] = defaultdict(list)
    for trajectory, calls in replies.items():
        by_type[types.get(trajectory)] += [judged[trajectory].get(c, 0.0) for c in calls]
    type_baseline = {t: statistics.fmean(v) for t, v in by_type.items() if v}
    by_group: dict[str, list[str]] = defaultdict(list)
    for trajectory in replies:
        group = (groups or {}).get(trajectory)
        if group is not None and judged[trajectory]:
            by_group[group].append(trajectory)
    group_baseline = {
        group: statistics.fmean(v for t in members for v in judged[t].values())
        for group, members in by_group.items()
        if len(members) >= 2
    }

    def baseline(trajectory: str) -> float:
        group = (groups or {}).get(trajectory)
        if group in group_baseline:
            return group_baseline[group]
        return type_baseline[types.get(trajectory)]

    return {
        trajectory: {call: value - baseline(trajectory) for call, value in mine.items()}
        for trajectory, mine in judged.items()
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
