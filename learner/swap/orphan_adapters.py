"""Unload the adapters of deleted tenants from the replicas.

A deleted tenant's calls go to the shared policy, and its lineage serves nothing, but the
adapters its steps loaded stayed in every replica: each one holds a slot of vLLM's
`--max-loras` / `--max-cpu-loras` that the live tenants need, and keeps retention from
deleting its checkpoint (it never deletes what a replica lists). The learner (`learn
--tenants`) unloads them when it sees a tenant go, and once at start (a tenant deleted while
no learner ran). The shared policy's adapters and the live tenants' are never touched: their
publishers keep their own windows (`LoraPublisher.keep`).

The adapters' memory copies (learner/swap/adapter_memory.py) go here too, once no replica
lists their adapter: after each publish's retention (learner/loop/publish.py) and after the
deleted tenants' adapters are unloaded. So the memory they take stays bounded by what the
replicas hold loaded: each lineage's window, and what an operator loaded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import httpx
from sqlalchemy import Engine

from learner.swap.adapter_memory import AdapterMemory
from learner.swap.publisher import PublishError, served_adapters
from store import tenants

log = logging.getLogger("onthejob.learner")


def unload_orphaned_adapters(
    engine: Engine,
    upstreams: Sequence[str],
    *,
    timeout: float = 10.0,
    memory: AdapterMemory | None = None,
) -> set[str]:
    """Unload every deleted tenant's adapter that a replica lists; the names unloaded. A
    replica that cannot be asked is skipped: a restarted replica has none loaded, and one
    that is away is swept the next time a tenant goes or the learner starts. ``memory``:
    the adapters' memory copies, swept after (`sweep_memory_copies`)."""
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
    if memory is not None:
        sweep_memory_copies(memory, upstreams, timeout=timeout)
    return unloaded


def sweep_memory_copies(
    memory: AdapterMemory, upstreams: Sequence[str], *, timeout: float = 10.0
) -> list[str]:
    """Remove the memory copies of the adapters no replica lists; the names removed. Where
    a replica cannot be asked, every copy stays (vLLM reads an adapter's path again when it
    needs it back from eviction): the next sweep tries again."""
    listed: set[str] = set()
    for upstream in upstreams:
        try:
            listed |= served_adapters(upstream, timeout=timeout)
        except (httpx.HTTPError, PublishError) as exc:
            log.info("adapters' memory copies kept: %s not asked (%s)", upstream, exc)
            return memory.sweep(None)  # what a writer that died left goes all the same
    try:
        removed = memory.sweep(listed)
    except OSError as exc:  # the next sweep tries again
        log.warning("adapters' memory copies not swept: %s", exc)
        return []
    if removed:
        log.info("memory copies of adapters no replica lists removed: %s", ", ".join(removed))
    return removed
