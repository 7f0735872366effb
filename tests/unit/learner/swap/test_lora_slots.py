"""vLLM sized for the tenants (learner/swap/lora_slots.py): the slots N tenants need, read
from each replica's configuration, and one warning per replica and shortfall that says what
to start it with."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from learner.swap.lora_slots import LoraSlots, SlotCheck, needed, shortfall
from learner.swap.publisher import PublishError


def config(max_loras: int | None, max_cpu_loras: int | None = None) -> dict[str, Any]:
    if max_loras is None:
        return {"lora_config": None}
    return {"lora_config": {"max_loras": max_loras, "max_cpu_loras": max_cpu_loras}}


def test_each_tenant_and_the_shared_policy_have_a_slot_and_their_window_in_memory() -> None:
    assert needed(0, 4) == LoraSlots(1, 5)
    assert needed(8, 4) == LoraSlots(9, 45)
    assert needed(32, 0) == LoraSlots(33, 33)


def test_the_memory_cache_defaults_to_the_batch_slots() -> None:
    assert LoraSlots.of(config(4)) == LoraSlots(4, 4)
    assert LoraSlots.of(config(4, 16)) == LoraSlots(4, 16)
    assert LoraSlots.of(config(None)) is None  # no LoRA served
    assert LoraSlots.of({}) is None


def test_a_shortfall_names_the_flags_to_start_vllm_with() -> None:
    need = needed(2, 1)  # 3 slots, 6 in memory
    assert shortfall(LoraSlots(3, 6), need) is None
    assert shortfall(LoraSlots(1, 1), need) == "--max-loras 3 (has 1), --max-cpu-loras 6 (has 1)"
    assert shortfall(LoraSlots(8, 4), need) == "--max-cpu-loras 6 (has 4)"


def test_the_check_warns_once_per_replica_and_shortfall_and_again_when_it_grows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    configs = {"http://a:8000": config(1), "http://b:8000": config(16, 64)}
    asked: list[str] = []

    def config_of(upstream: str) -> dict[str, Any]:
        asked.append(upstream)
        return configs[upstream]

    check = SlotCheck(list(configs), config_of=config_of)
    caplog.set_level(logging.WARNING, logger="onthejob.learner")
    (said,) = check.check(2, 4)
    assert said.startswith("http://a:8000 has too few LoRA slots for 2 tenants")
    assert "start it with --max-loras 3 (has 1), --max-cpu-loras 15 (has 1)" in said
    assert check.check(2, 4) == []  # said once
    grown = check.check(20, 4)  # a's shortfall grew, and b falls short too
    assert [line.split(" ")[0] for line in grown] == ["http://a:8000", "http://b:8000"]
    assert "--max-loras 21 (has 16), --max-cpu-loras 105 (has 64)" in grown[1]
    assert len(caplog.records) == 3
    assert sorted(set(asked)) == sorted(configs) and len(asked) == 2  # read once each


def test_a_replica_that_does_not_say_is_left_alone() -> None:
    def config_of(upstream: str) -> dict[str, Any]:
        raise PublishError("404 Not Found (no dev mode)")

    assert SlotCheck(["http://a:8000"], config_of=config_of).check(5, 4) == []
