"""An in-process proxy in front of the fake vLLM, with an admin token and a fast policy
poll, and what the tenants' and canaries' tests ask of it: the admin API, and a wait until
the proxy has read which adapters its replica holds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.fake_vllm import FakeVLLM
from tests.support.inprocess import InProcessProxy

TOKEN = "admin-secret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def settings(fake_vllm: FakeVLLM, db_url: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "upstreams": [fake_vllm.url],
        "database_url": db_url,
        "spool_path": tmp_path / "spool.jsonl",
        "admin_token": TOKEN,
        "policy_poll_interval": 0.05,
    }


async def admin(proxy: InProcessProxy, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return await proxy.http.request(method, "/admin/api" + path, headers=ADMIN, **kwargs)


async def adapters_read(proxy: InProcessProxy, wanted: set[str]) -> None:
    """Bounded: until the proxy has read that its replica has exactly `wanted` loaded."""
    deadline = time.monotonic() + 10
    while True:
        health = (await proxy.http.get("/healthz")).json()
        if set(health["upstreams"][0]["adapters"]) == wanted:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"adapters {wanted} never read; last health {health}")
        await asyncio.sleep(0.02)
