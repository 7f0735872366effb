"""Feedback posted to the proxy lands in the store for the feedback grader: the app
in-process (tests/support/inprocess.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from sqlalchemy import Engine, select

from learner.vllm_server import free_port
from store.models import Feedback
from tests.support.inprocess import in_process_proxy

TOKEN = "fb-secret"
URL = "/v1/onthejob/feedback"


def _settings(db_url: str, tmp_path: Path, **extra: object) -> dict[str, object]:
    # feedback never reaches an upstream: one nobody answers
    return {
        "upstreams": [f"http://127.0.0.1:{free_port()}"],
        "database_url": db_url,
        "spool_path": tmp_path / "spool.jsonl",
        **extra,
    }


def test_feedback_needs_the_token_and_is_stored(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    good = {"trajectory_id": "t1", "reward": 0.75, "comment": "nice"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    bad_bodies = (
        b'{"trajectory_id": "t1"}',
        b'{"reward": 1}',
        b'{"trajectory_id": "t1", "reward": "x"}',
        b'{"trajectory_id": "t1", "reward": 1e999}',
        b"not json",
    )

    async def post() -> dict[str, object]:
        config = _settings(db_url, tmp_path, feedback_token=TOKEN)
        async with in_process_proxy(**config) as proxy:
            http: httpx.AsyncClient = proxy.http
            wrong = await http.post(URL, json=good, headers={"Authorization": "Bearer nope"})
            return {
                "none": (await http.post(URL, json=good)).status_code,
                "wrong": (wrong.status_code, wrong.json()["error"]["type"]),
                "bad": [(await http.post(URL, content=b, headers=auth)).status_code
                        for b in bad_bodies],
                "good": (await http.post(URL, json=good, headers=auth)).status_code,
                "session": (
                    await http.post("/s/run-9" + URL, json={"reward": -1}, headers=auth)
                ).status_code,
            }  # fmt: skip

    answers = asyncio.run(post())
    assert answers["none"] == 401
    assert answers["wrong"] == (401, "authentication_error")
    assert answers["bad"] == [400] * len(bad_bodies)
    assert answers["good"] == 201 and answers["session"] == 201
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                Feedback.trajectory_id, Feedback.session_key, Feedback.reward, Feedback.comment
            ).order_by(Feedback.id)
        ).all()
    assert [tuple(r) for r in rows] == [("t1", None, 0.75, "nice"), (None, "run-9", -1.0, None)]


def test_feedback_is_off_without_a_token(db_url: str, engine: Engine, tmp_path: Path) -> None:
    async def post() -> int:
        async with in_process_proxy(**_settings(db_url, tmp_path)) as proxy:
            response = await proxy.http.post(URL, json={"session": "s", "reward": 1})
            return response.status_code

    assert asyncio.run(post()) == 403
