"""Where a full-weight candidate serves: the replicas its canary's share comes nearest to."""

from __future__ import annotations

import pytest

from learner.canary.starts import candidate_replicas

REPLICAS = [f"http://r{i}" for i in range(6)]


@pytest.mark.parametrize(
    ("replicas", "share", "count"),
    [
        (2, 0.1, 1),  # at least one
        (2, 0.5, 1),
        (2, 0.9, 1),  # never all: the incumbent keeps one
        (4, 0.3, 1),  # 1.2 replicas: the nearest
        (4, 0.4, 2),  # 1.6
        (4, 0.5, 2),
        (6, 0.25, 2),  # 1.5 rounds up
        (6, 1.0, 5),
    ],
)
def test_a_candidate_serves_on_the_share_of_the_replicas_its_sessions_come_nearest_to(
    replicas: int, share: float, count: int
) -> None:
    upstreams = REPLICAS[:replicas]
    chosen = candidate_replicas(upstreams, share)
    assert chosen == upstreams[replicas - count :]  # the last: the first keeps the incumbent


def test_one_replica_cannot_serve_a_candidate_beside_the_incumbent() -> None:
    with pytest.raises(ValueError, match="two or more replicas"):
        candidate_replicas(REPLICAS[:1], 0.5)
