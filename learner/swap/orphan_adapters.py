"""Unload the adapters of deleted tenants from the replicas.

A deleted tenant's calls go to the shared policy, and its lineage serves nothing, but the
adapters its steps loaded stayed in every replica: each one holds a slot of vLLM's
`--max-loras` / `--max-cpu-loras` that the live tenants need, and keeps retention from
deleting its checkpoint (it never deletes what a replica lists). The learner (`learn
--tenants`) unloads them when it sees a tenant go, and once at start (a tenant deleted while
no learner ran). The shared policy's adapters and the live tenants' are never touched: their
publishers keep their own windows (`LoraPublisher.keep`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import httpx
from sqlalchemy import Engine

from learner.swap.publisher import PublishError, served_adapters
from store import tenants

log = logging.getLogger("onthejob.learner")


def unload_orphaned_adapters(
    engine: Engine, upstreams: Sequence[str], *, timeout: float = 10.0
) -> set[str]:
    """Unload every deleted tenant's adapter that a replica lists; the names unloaded. A
    replica that cannot be asked is skipped: a restarted replica has none loaded, and one
    that is away is swept the next time a tenant goes or the learner starts."""
    listed: dict[str, set[str]] = {}
    for upstream in upstreams:
        try:
            listed[upstream] = served_adapters(upstream, timeout=timeout)
        except (httpx.HTTPError, PublishError) as exc:
            log.warning("deleted tenants' adapters: %s not asked (%s)", upstream, exc)
    with engine.connect() as conn:
        orphans = tenants.orphaned_versions(conn, set().union(*listed.values()))
    unloaded: set[str] = set()
    with httpx.Client(timeout=timeout) as client:
        for upstream, loaded in listed.items():
            for name in sorted(orphans & loaded):
                # a replica that refuses keeps it; the next sweep tries again
                with contextlib.suppress(httpx.HTTPError):
                    body = {"lora_name": name}
                    url = upstream.rstrip("/") + "/v1/unload_lora_adapter"
                    client.post(url, json=body).raise_for_status()
                    unloaded.add(name)
    return unloaded
