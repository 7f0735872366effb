"""What the running proxy holds: settings, the upstream pool, the recorder, keys, tenants,
canaries and the teacher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from proxy.base.keys import KeyRing
from proxy.recording.recorder import Recorder
from proxy.recording.response_store import ResponseStore
from proxy.settings import Settings
from proxy.upstream.canaries import CanaryTable
from proxy.upstream.replicas import UpstreamPool
from proxy.upstream.teacher import Teacher
from proxy.upstream.tenants import TenantTable


class StoreIdentity(TypedDict):
    """The store a proxy records to (store/identity.py)."""

    id: str | None  # None until read
    url: str | None  # public_url: its password hidden


@dataclass
class ProxyState:
    settings: Settings
    pool: UpstreamPool
    recorder: Recorder
    responses: ResponseStore
    keys: KeyRing
    tenants: TenantTable
    canaries: CanaryTable
    # the stronger upstream that answers chosen traffic (`serve --teacher-url`); None: none
    teacher: Teacher | None = None
    # the store it records to
    store: StoreIdentity = field(default_factory=lambda: {"id": None, "url": None})
