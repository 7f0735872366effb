"""vLLM sized for the tenants: enough adapter slots that a tenant's call never waits for its
adapter to be read from disk again.

vLLM holds LoRA adapters in two places: `--max-loras` slots that one batch can use at once,
and `--max-cpu-loras` adapters kept loaded in memory (default: as many as `--max-loras`).
An adapter past the memory cache is dropped and read from disk at its next request. With
`learn --tenants`, each tenant's calls go to its own serving adapter, and the learner keeps
every version a sample may still be trained from loaded (`--max-staleness` + 1 a lineage,
learner/swap/lora_publisher.py), the shared policy's adapters too. So, for N tenants:

- `--max-loras` N + 1: every tenant and the shared policy in one batch;
- `--max-cpu-loras` (N + 1) x (max_staleness + 1): every version the learner keeps loaded.

The learner reads each replica's settings (dev-mode `/server_info`) when its tenants change
and says, once per shortfall, what to start vLLM with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from learner.swap.publisher import PublishError, server_config
from store.json_types import JsonObject

log = logging.getLogger("onthejob.learner")


@dataclass(frozen=True)
class LoraSlots:
    """A replica's adapter slots: in one batch, and kept in memory."""

    max_loras: int
    max_cpu_loras: int

    @classmethod
    def of(cls, config: JsonObject) -> LoraSlots | None:
        """From a replica's vllm_config; None where it serves no adapters."""
        lora = config.get("lora_config")
        if not isinstance(lora, dict) or not isinstance(lora.get("max_loras"), int):
            return None
        cpu = lora.get("max_cpu_loras")
        return cls(lora["max_loras"], cpu if isinstance(cpu, int) else lora["max_loras"])


def needed(tenants: int, max_staleness: int) -> LoraSlots:
    """The slots `tenants` tenants and the shared policy need (the rule above)."""
    lineages = tenants + 1
    return LoraSlots(max_loras=lineages, max_cpu_loras=lineages * (max_staleness + 1))


def shortfall(have: LoraSlots, need: LoraSlots) -> str | None:
    """What to start the replica with, where `have` falls short of `need` (None: enough)."""
    short = []
    if have.max_loras < need.max_loras:
        short.append(f"--max-loras {need.max_loras} (has {have.max_loras})")
    if have.max_cpu_loras < need.max_cpu_loras:
        short.append(f"--max-cpu-loras {need.max_cpu_loras} (has {have.max_cpu_loras})")
    return ", ".join(short) or None


class SlotCheck:
    """Says once per replica and shortfall when a replica has too few slots for the tenants
    defined; a replica that does not say (no dev mode, no LoRA) is left alone."""

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        config_of: Callable[[str], JsonObject] = server_config,
    ) -> None:
        self.upstreams = list(upstreams)
        self.config_of = config_of
        self.said: dict[str, str | None] = {}
        self.slots: dict[str, LoraSlots | None] = {}

    def check(self, tenants: int, max_staleness: int) -> list[str]:
        """The warnings this look says (each said once)."""
        need = needed(tenants, max_staleness)
        said = []
        for upstream in self.upstreams:
            have = self._slots(upstream)
            why = None if have is None else shortfall(have, need)
            if why is not None and why != self.said.get(upstream):
                message = (
                    f"{upstream} has too few LoRA slots for {tenants} tenants and the shared "
                    f"policy, each keeping {max_staleness + 1} versions loaded: start it with "
                    f"{why}; until then a tenant's call may wait for its adapter to be read "
                    "from disk again"
                )
                log.warning("%s", message)
                said.append(message)
            self.said[upstream] = why
        return said

    def _slots(self, upstream: str) -> LoraSlots | None:
        if upstream not in self.slots:
            try:
                self.slots[upstream] = LoraSlots.of(self.config_of(upstream))
            except PublishError as exc:
                log.info("LoRA slots of %s unknown (%s): not checked", upstream, exc)
                self.slots[upstream] = None
        return self.slots[upstream]
