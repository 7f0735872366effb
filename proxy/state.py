"""What the running proxy holds: settings, the upstream pool and the recorder."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.recording import Recorder
from proxy.response_store import ResponseStore
from proxy.settings import Settings
from proxy.upstream import UpstreamPool


@dataclass
class ProxyState:
    settings: Settings
    pool: UpstreamPool
    recorder: Recorder
    responses: ResponseStore
