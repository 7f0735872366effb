"""Feedback posted to the proxy lands in the store for the feedback grader."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from learner.demo.vllm_server import free_port
from store.models import Feedback

TOKEN = "fb-secret"


def test_feedback_needs_the_token_and_is_stored(db_url, engine, start_proxy):
    proxy = start_proxy(
        [f"http://127.0.0.1:{free_port()}"], db_url, env={"ONTHEJOB_FEEDBACK_TOKEN": TOKEN}
    )
    url = proxy.url + "/v1/onthejob/feedback"
    good = {"trajectory_id": "t1", "reward": 0.75, "comment": "nice"}
    assert httpx.post(url, json=good).status_code == 401
    wrong = httpx.post(url, json=good, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for bad in (
        b'{"trajectory_id": "t1"}',
        b'{"reward": 1}',
        b'{"trajectory_id": "t1", "reward": "x"}',
        b'{"trajectory_id": "t1", "reward": 1e999}',
        b"not json",
    ):
        response = httpx.post(url, content=bad, headers=auth)
        assert response.status_code == 400, bad
    assert httpx.post(url, json=good, headers=auth).status_code == 201
    by_session = httpx.post(
        proxy.url + "/s/run-9/v1/onthejob/feedback", json={"reward": -1}, headers=auth
    )
    assert by_session.status_code == 201
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                Feedback.trajectory_id, Feedback.session_key, Feedback.reward, Feedback.comment
            ).order_by(Feedback.id)
        ).all()
    assert [tuple(r) for r in rows] == [("t1", None, 0.75, "nice"), (None, "run-9", -1.0, None)]


def test_feedback_is_off_without_a_token(db_url, engine, start_proxy):
    proxy = start_proxy([f"http://127.0.0.1:{free_port()}"], db_url)
    response = httpx.post(proxy.url + "/v1/onthejob/feedback", json={"session": "s", "reward": 1})
    assert response.status_code == 403
    assert "ONTHEJOB_FEEDBACK_TOKEN" in response.json()["error"]["message"]
