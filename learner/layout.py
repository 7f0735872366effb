"""What a checkpoint directory is, read from its files alone: full weights or a LoRA adapter,
and the full weights an adapter needs under it.

Torch-free on purpose: the proxy's admin API serves earlier versions again (rollback,
promote) through learner/swap/versions.py, and must not need the model libraries to do so.
"""

from __future__ import annotations

import json
from pathlib import Path

from store.json_types import JsonObject

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint directory that vLLM must not be asked to load."""


def is_adapter(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(adapter_dir: Path) -> Path:
    """The full checkpoint an adapter was trained on top of."""
    config = read_adapter_config(Path(adapter_dir))
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise CheckpointError(f"{adapter_dir}: {ADAPTER_CONFIG} names no base model")
    return Path(base)


def served_base(checkpoint: Path) -> Path:
    """The full weights a checkpoint serves on: itself, or the base an adapter names."""
    return adapter_base(checkpoint) if is_adapter(checkpoint) else Path(checkpoint)


def read_adapter_config(adapter_dir: Path) -> JsonObject:
    try:
        config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{adapter_dir}: unreadable {ADAPTER_CONFIG}: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{adapter_dir}: {ADAPTER_CONFIG} is not a JSON object")
    return config
