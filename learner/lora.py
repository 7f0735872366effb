"""LoRA adapters (peft): wrap a model for training, save and load adapter checkpoints.

An adapter checkpoint is a directory vLLM loads with ``/v1/load_lora_adapter``:
``adapter_config.json`` + ``adapter_model.safetensors``. Its ``base_model_name_or_path``
names the full checkpoint it was trained on top of (the weights vLLM must be serving under
it), so a learner that resumes from an adapter knows which base to load. Like full
checkpoints, an adapter directory is complete or absent (written aside, then renamed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import SafetensorError, safe_open
from transformers import PreTrainedModel

from learner.checkpoint import load_model, new_directory
from learner.layout import (
    ADAPTER_WEIGHTS,
    CheckpointError,
    adapter_base,
    read_adapter_config,
)

# The projections of every decoder layer (Llama/Qwen naming); vLLM serves LoRA on all.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        if not self.targets:
            raise ValueError("LoRA needs at least one target module")


def lora_config(settings: LoraSettings) -> LoraConfig:
    """The peft config of a fresh adapter under ``settings``."""
    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        target_modules=list(settings.targets),
        lora_dropout=0.0,  # vLLM samples without dropout: the ratio must compare like with like
        bias="none",
    )


def wrap(model: PreTrainedModel, settings: LoraSettings) -> PeftModel:
    """A fresh adapter on ``model``: B starts at zero, so the policy is unchanged at first."""
    return get_peft_model(model, lora_config(settings))


def load_trainable(adapter_dir: Path, base_dtype: torch.dtype = torch.float32) -> PeftModel:
    """The base the adapter names, in ``base_dtype``, with the adapter on it (float32, as
    peft makes it), ready to train on."""
    base = load_model(adapter_base(adapter_dir), base_dtype)
    model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
    return model.eval()


def merge(model: PeftModel) -> PreTrainedModel:
    """The adapter folded into the base weights: a plain model for full fine-tuning."""
    merged = model.merge_and_unload()
    return merged.requires_grad_(True)  # peft froze the base weights: they train again


def save_adapter(model: PeftModel, out_dir: Path, *, base_dir: Path) -> Path:
    """Write the active adapter of ``model`` (its only one, or a tenant's of several on one
    base: learner/adapter_bank.py) to the new directory ``out_dir``; return it. The files
    are the same whatever the adapter is called in ``model``.

    Raises ``FileExistsError`` if ``out_dir`` exists: a published version is immutable.
    """
    out_dir = Path(out_dir)
    with new_directory(out_dir) as tmp:
        write_adapter(model, tmp, base_dir=base_dir)
    return out_dir


def write_adapter(model: PeftModel, directory: Path, *, base_dir: Path) -> None:
    """The files of ``save_adapter``, written into the empty ``directory`` as they are: the
    caller stages and renames it (a checkpoint, or the memory copy vLLM loads:
    learner/swap/adapter_memory.py)."""
    directory = Path(directory)
    name = model.active_adapter
    # the base is a local directory, named absolutely: the learner reloads it on resume
    config = model.peft_config[name]
    config.base_model_name_or_path = str(Path(base_dir).resolve())
    # peft adds more than the adapter's lora_ tensors for these: it picks them itself
    plain = getattr(config, "bias", "none") == "none" and not (
        getattr(config, "modules_to_save", None) or getattr(config, "trainable_token_indices", None)
    )
    model.save_pretrained(
        str(directory),
        safe_serialization=True,
        selected_adapters=[name],
        state_dict=adapter_tensors(model, name) if plain else None,
    )
    if name != "default":  # peft writes any other adapter into a folder of its name
        for path in (directory / name).iterdir():
            path.rename(directory / path.name)
        (directory / name).rmdir()
    (directory / "README.md").unlink(missing_ok=True)  # peft's model card template: noise


def adapter_tensors(model: PeftModel, name: str) -> dict[str, torch.Tensor]:
    """The adapter `name`'s lora_ tensors under their state-dict names: what peft would pick
    out of the whole state dict itself, key by key against every adapter's name (on a
    SmolLM2 bank, whose state dict holds the base and every tenant's adapter, a write took
    278 ms standalone that way, 154 ms handed these). Only for a plain LoRA adapter (no
    bias, modules_to_save or trainable tokens, which peft adds from the whole dict)."""
    picked = {}
    for key, value in model.state_dict(keep_vars=True).items():
        parts = key.split(".")
        if name in parts and any(part.startswith("lora_") for part in parts):
            picked[key] = value.detach()
    return picked


def validate_adapter(adapter_dir: Path, *, max_rank: int | None = None) -> None:
    """Raise ``CheckpointError`` unless vLLM can load this adapter as it is.

    Checked before any replica is asked: the config must parse and name its base, the
    weights must read back finite, and the rank must fit the server's ``--max-lora-rank``.
    """
    adapter_dir = Path(adapter_dir)
    config = read_adapter_config(adapter_dir)
    adapter_base(adapter_dir)
    rank = config.get("r")
    if max_rank is not None and isinstance(rank, int) and rank > max_rank:
        raise CheckpointError(f"{adapter_dir}: rank {rank} exceeds --max-lora-rank {max_rank}")
    path = adapter_dir / ADAPTER_WEIGHTS
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
            if not names:
                raise CheckpointError(f"{path}: no tensors")
            for name in names:
                tensor = f.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise CheckpointError(f"{path}: {name} holds NaN or infinite values")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{adapter_dir}: unreadable adapter weights: {exc}") from exc
