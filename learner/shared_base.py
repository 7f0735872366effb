"""One copy of a LoRA model's frozen base, shared by every trainer on that base.

A trainer built while another on the same base lives (the shared policy's, rebuilt; the
tenants' one model of adapters, learner/adapter_bank.py, beside the shared policy's
trainer) would load the base again: SmolLM2 is 270 MB in bf16, a 7B model 15 GB. (Each
tenant's trainer was such a model of its own before issue 46.) The base never changes (its
parameters are frozen, and a checkpoint directory is immutable once written), so a model
loaded on a base another live model holds takes that model's tensors in place of its own,
which it then drops. Nothing is kept alive by this: the registry holds its parameters
weakly, and a base no trainer holds any more is loaded afresh next time.

Only for parameters that are frozen before training starts; a caller that changes a frozen
tensor in place (merging an adapter into its base) must not share it.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch

# (base directory and its identity, parameter name, device, dtype, shape) -> the live models'
# frozen parameters that hold it, weakly: any one of them that lives can lend its tensor
_Key = tuple[str, tuple[int, int, int], str, str, torch.dtype, tuple[int, ...]]
_held: dict[_Key, list[weakref.ref[torch.nn.Parameter]]] = {}


def _live(key: _Key) -> torch.nn.Parameter | None:
    refs = [ref for ref in _held.get(key, []) if ref() is not None]
    if refs:
        _held[key] = refs
    else:
        _held.pop(key, None)
    return refs[0]() if refs else None


@torch.no_grad()
def share_frozen(model: torch.nn.Module, base_dir: Path) -> int:
    """Point `model`'s frozen parameters at those of a live model on the same base (same
    name, device, dtype and shape), and offer its own to later models; the bytes no longer
    held twice. Call it once the model is on its device and in its dtype."""
    base = Path(base_dir).resolve()
    # a directory written again under the same path (a new one renamed into place) is
    # another base: its inode and times differ
    info = base.stat()
    identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
    saved = 0
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            continue
        key = (
            str(base),
            identity,
            name,
            str(parameter.device),
            parameter.dtype,
            tuple(parameter.shape),
        )
        held = _live(key)
        if held is not None and held.data_ptr() != parameter.data_ptr():
            parameter.data = held.data
            saved += parameter.numel() * parameter.element_size()
        _held.setdefault(key, []).append(weakref.ref(parameter))
    return saved
