"""A vLLM-CPU fix, installed by our vLLM plugin (learner/swap/vllm_plugin.py): prompt
logprobs from a LoRA-enabled server, in a batch of two requests or more, crash its engine.

vLLM computes a request's prompt logprobs with one logits row per prompt token, while the
LoRA logits layer indexes its adapters by one row per request of the batch
(`sampler_indices`; vLLM issues 16668, 29955, 51594). On GPUs the rows are silently
misaligned; on CPUs the einsum fails and the engine dies: `einsum(): subscript b has size
N ...`. Every verified LoRA publish asks for prompt logprobs (its probe), so a swap under
live traffic killed the replica.

The LoRA logits layer only adds an adapter's `lm_head` delta. Our adapters train no
`lm_head` (learner/lora.py's targets), so while no loaded adapter has one, the delta is
zero and leaving it out is exact. A misaligned call with an `lm_head` delta loaded still
fails, with a message that says why.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger("onthejob.vllm_plugin")

PATCHED = "_onthejob_prompt_logprobs_fix"


def install() -> None:
    """Wrap the CPU punica wrapper's `add_lora_logits` (on CPU platforms only)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    original = PunicaWrapperCPU.add_lora_logits
    if getattr(original, PATCHED, False):
        return

    @functools.wraps(original)
    def add_lora_logits(
        self: Any, y: Any, x: Any, lora_a_stacked: Any, lora_b_stacked: Any, scale: Any,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        rows = x.view(-1, x.shape[-1]).size(0)
        indices = self.sampler_indices.size(0)
        if rows == indices or indices == 1:  # aligned, or one request: broadcast is right
            return original(self, y, x, lora_a_stacked, lora_b_stacked, scale, **kwargs)
        if not bool(lora_b_stacked.any()):
            if not getattr(add_lora_logits, "said", False):
                add_lora_logits.said = True  # type: ignore[attr-defined]
                log.warning(
                    "onthejob: prompt logprobs batched under LoRA (%d rows, %d requests): "
                    "no adapter has an lm_head delta, so the base logits are exact",
                    rows,
                    indices,
                )
            return None  # no adapter has an lm_head delta: the logits are the base's
        raise RuntimeError(
            "vLLM-CPU cannot compute prompt logprobs in a batch while an adapter with an "
            "lm_head delta is loaded (vLLM issue 16668)"
        )

    setattr(add_lora_logits, PATCHED, True)
    PunicaWrapperCPU.add_lora_logits = add_lora_logits
