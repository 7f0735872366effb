"""What the running proxy holds: settings, the upstream pool, the recorder, keys, tenants
and canaries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.base.keys import KeyRing
from proxy.recording.recorder import Recorder
from proxy.recording.response_store import ResponseStore
from proxy.settings import Settings
from proxy.upstream.canaries import CanaryTable
from proxy.upstream.replicas import UpstreamPool
from proxy.upstream.tenants import TenantTable


@dataclass
class ProxyState:
    settings: Settings
    pool: UpstreamPool
    recorder: Recorder
    responses: ResponseStore
    keys: KeyRing
    tenants: TenantTable
    canaries: CanaryTable
    # the store it records to: {"id", "url"} (store/identity.py); id None until read
    store: dict[str, Any] = field(default_factory=lambda: {"id": None, "url": None})
