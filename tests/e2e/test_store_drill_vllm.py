"""Fault drill: the database refuses one row in the middle of a session.

A trigger in the real database (PostgreSQL or SQLite) refuses the second call of a
four-call conversation: the proxy keeps it in `<spool>.rejected`, and the two calls after
it refer to it as their prompt's parent. Their prompts cannot be rebuilt, so they are not
trained on; the first call and every other trajectory are, and the learner does not crash.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select, text

from learner.vllm_server import VLLMServer
from store import db
from store.export import from_export, iter_trajectories
from store.models import Call, Grade, Trajectory
from store.samples import build_samples
from tests.support.drills import (
    FAST_GATES,
    TASK,
    Traffic,
    assert_invariants,
    drill_learner,
    finished_count,
    wait_until,
)

pytestmark = [pytest.mark.vllm]
MARK = "REFUSE-ME"

POSTGRES_TRIGGER = [
    f"""CREATE FUNCTION refuse_marked() RETURNS trigger AS $$ BEGIN
        IF NEW.request::text LIKE '%{MARK}%' THEN RAISE EXCEPTION 'refused for the drill';
        END IF; RETURN NEW; END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER refuse_marked BEFORE INSERT ON calls
        FOR EACH ROW EXECUTE FUNCTION refuse_marked()""",
]
SQLITE_TRIGGER = [
    f"""CREATE TRIGGER refuse_marked BEFORE INSERT ON calls
        WHEN NEW.request LIKE '%{MARK}%'
        BEGIN SELECT RAISE(ABORT, 'refused for the drill'); END""",
]


def refuse_marked_rows(engine: Engine) -> None:
    statements = POSTGRES_TRIGGER if engine.dialect.name == "postgresql" else SQLITE_TRIGGER
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def conversation(traffic: Traffic, session: str, turns: list[str], refused: int) -> None:
    """One multi-turn conversation: each call sends the whole history so far; call number
    `refused` carries the mark (in its `user` field, which the next calls do not repeat)."""
    messages: list[dict[str, str]] = []
    for number, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        body = {"model": traffic.model, "messages": messages, "max_tokens": 8}
        if number == refused:
            body["user"] = MARK
        response = httpx.post(
            f"{traffic.proxy.url}/s/{session}/v1/chat/completions",
            json=body,
            headers={"X-Onthejob-Task": TASK},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        traffic.answered[session] += 1
        messages.append(
            {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}
        )


def test_a_refused_row_costs_its_own_line_of_the_conversation_only(
    vllm: VLLMServer, tiny_model: Path, db_url: str, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    refuse_marked_rows(engine)
    # idle long enough that a loaded machine does not split the conversation in two
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "3"], env=FAST_GATES)
    traffic = Traffic(proxy, vllm.model_name)
    learner = drill_learner(db_url, vllm, tiny_model, tmp_path)
    try:
        learner.start()
        conversation(traffic, "chain", ["hello", "go on", "and then?", "the end"], refused=1)
        others = traffic.batch("single", 7)
        wait_until(lambda: proxy.health()["recording"]["rejected"] == 1, "one row refused")
        wait_until(lambda: finished_count(engine, [*others, "chain"]) == 8, "all finished")
        traffic.answered["chain"] -= 1  # the refused one is in <spool>.rejected, not the store

        (chain,) = iter_trajectories(engine, ids=[_trajectory_of(engine, "chain")])
        prompts = [c["prompt_token_ids"] for c in chain["calls"]]
        assert len(prompts) == 3 and prompts[0] and prompts[1:] == [None, None]
        # the first call; the rest cannot be rebuilt
        assert len(build_samples(from_export(chain))) == 1

        wait_until(lambda: not learner.grade_finished(), "graded")
        assert learner.maybe_train()
        with engine.connect() as conn:
            trained = conn.execute(
                select(Grade.trained_in_step).where(Grade.trajectory_id == chain["id"])
            ).scalar_one()
        assert trained == 1 and learner.state.step == 1
        assert_invariants(engine, traffic.answered)
    finally:
        learner.state.engine.dispose()
        engine.dispose()


def _trajectory_of(engine: Engine, session: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            select(Trajectory.id).where(
                Trajectory.id.in_(select(Call.trajectory_id).where(Call.session_key == session))
            )
        ).scalar_one()
