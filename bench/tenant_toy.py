"""Two tenants whose rewards conflict (bench/tenants.py): on the same prompts, the tenant
`more-a` is rewarded for the share of the letter 'a' in a reply, the tenant `fewer-a` for
its absence. One shared policy cannot please both."""

from __future__ import annotations

from typing import Any

from bench.letter_toy import reply_text, share_of_a

MORE_A, FEWER_A = "more-a", "fewer-a"
TENANTS = (MORE_A, FEWER_A)


def reward_for(tenant: str, text: str) -> float:
    share = share_of_a(text)
    return share if tenant == MORE_A else 1.0 - share


def tenant_reward(trajectory: dict[str, Any]) -> float:
    """Python grader (python:bench.tenant_toy:tenant_reward): by the calls' client key, whose
    name is the tenant's."""
    key = trajectory["calls"][-1].get("key_name")
    if key not in TENANTS:
        raise ValueError(f"a call of neither tenant (key {key!r})")
    return reward_for(key, reply_text(trajectory))
