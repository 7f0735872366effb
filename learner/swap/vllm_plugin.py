"""The vLLM general plugin of onthejob (entry point ``vllm.general_plugins``).

vLLM calls ``register`` in each of its processes. It only names our weight-transfer engine;
the engine's module is imported when a replica is started with
``--weight-transfer-config '{"backend": "onthejob_shm"}'``, so vLLM servers that do not ask for
it load nothing of ours.
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
