"""The learner decides running canaries from what the calls recorded (learner/loop/canaries.py),
on SQLite and PostgreSQL: a better reward is promoted (the tenant's pointer moves), a better
reward with more complaints is rolled back (nothing that serves moves), too few calls wait,
and the shared policy's promotion is left to an operator. Each decision is the learner's."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Engine

from learner.loop.canaries import Canaries
from store import canaries, tenants
from tests.support import canary_traffic

T0 = time.time() - 600  # the canaries started 10 minutes ago; their calls since


def start(engine: Engine, tenant: str | None, *, candidate: str, incumbent: str) -> int:
    with engine.begin() as conn:
        if tenant is not None:
            now = datetime.now(UTC)
            tenants.put_tenant(conn, name=tenant, client_keys=[], interaction_types=[], now=now)
            tenants.set_serving(conn, name=tenant, version=incumbent, now=now)
        return canaries.start_canary(
            conn, tenant=tenant, candidate=candidate, incumbent=incumbent, share=0.5,
            min_calls=30, time_limit=timedelta(hours=1), default_decision="rollback",
            by="admin", now=datetime.fromtimestamp(T0, UTC),
        )  # fmt: skip


# one single-call trajectory per reward, answered by a version after T0, graded; the first
# `complaints` of them with a correction on their call
serve = partial(canary_traffic.serve, at=T0 + 1)


def state_of(engine: Engine, canary_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        found = canaries.get_canary(conn, canary_id)
    assert found is not None
    return found


def serving(engine: Engine, tenant: str) -> str | None:
    with engine.connect() as conn:
        found = tenants.get_tenant(conn, tenant)
    assert found is not None
    return found["serving_version"]


def test_a_better_candidate_is_promoted_and_a_hacking_one_rolled_back(engine: Engine) -> None:
    better = start(engine, "good", candidate="good-2", incumbent="good-1")
    serve(engine, "good", "good-2", [1.0, 1.0, 0.0, 1.0] * 15)
    serve(engine, "good", "good-1", [0.0, 0.0, 1.0, 0.0] * 15)
    # the grader likes the candidate; its users correct it on most calls
    hacking = start(engine, "gamed", candidate="gamed-2", incumbent="gamed-1")
    serve(engine, "gamed", "gamed-2", [1.0] * 60, complaints=45)
    serve(engine, "gamed", "gamed-1", [0.0, 1.0] * 30, complaints=3)

    assert Canaries(engine).decide_running() == 2

    promoted, rolled = state_of(engine, better), state_of(engine, hacking)
    assert (promoted["status"], promoted["decided_by"]) == ("promoted", "learner")
    assert "reward is better" in promoted["reason"]
    assert serving(engine, "good") == "good-2"
    assert (rolled["status"], rolled["decided_by"]) == ("rolled_back", "learner")
    assert "complaints" in rolled["reason"]
    assert serving(engine, "gamed") == "gamed-1"  # nothing that serves moved
    assert [a["action"] for a in rolled["actions"]] == ["start", "rollback"]


def test_too_few_calls_wait_and_the_shared_policy_is_left_to_an_operator(
    engine: Engine,
) -> None:
    early = start(engine, "new", candidate="new-2", incumbent="new-1")
    serve(engine, "new", "new-2", [1.0] * 20)
    serve(engine, "new", "new-1", [0.0] * 20)
    shared = start(engine, None, candidate="base-2", incumbent="base-1")
    serve(engine, None, "base-2", [1.0] * 60)
    serve(engine, None, "base-1", [0.0] * 60)

    assert Canaries(engine).decide_running() == 0

    assert state_of(engine, early)["status"] == "running"
    assert state_of(engine, shared)["status"] == "running"
