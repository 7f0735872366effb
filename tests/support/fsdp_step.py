"""Steps of the sharded trainer on a given batch, for tests/integration/test_fsdp.py.

Run under torchrun: ``torchrun --nproc-per-node N tests/support/fsdp_step.py MODEL_DIR BATCH OUT
PRECISION``. BATCH is a pickle of ``{"samples", "advantages", "steps", "learning_rate",
"micro_batch_tokens", "max_grad_norm", "activation_checkpointing", "kl_coef"}`` (with a
kl_coef, MODEL_DIR is also the KL reference);
rank 0 writes to OUT (torch.save) the step metrics, the float32 weights gathered after the
steps, the checkpoint tensors, the training state, and that state as a trainer built
afresh holds it once it loaded it.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from learner.distributed import Ranks, build_trainer
from learner.loss import LossConfig
from learner.trainer import TrainerConfig


def main(model_dir: str, batch_path: str, out: str, precision: str) -> int:
    batch = pickle.loads(Path(batch_path).read_bytes())
    ranks = Ranks()
    config = TrainerConfig(
        learning_rate=batch["learning_rate"],
        micro_batch_tokens=batch["micro_batch_tokens"],
        max_grad_norm=batch["max_grad_norm"],
        precision=precision,
        activation_checkpointing=batch.get("activation_checkpointing", False),
        loss=LossConfig(kl_coef=batch.get("kl_coef", 0.0)),
    )
    reference = Path(model_dir) if config.loss.kl_coef > 0 else None
    trainer = build_trainer(ranks, Path(model_dir), config, reference)
    metrics = [trainer.step(batch["samples"], batch["advantages"]) for _ in range(batch["steps"])]
    if trainer.reference_root is not None:
        # the frozen reference is back to its shards after every pass
        for parameter in trainer.reference_root.parameters():
            sharded = (
                isinstance(parameter, DTensor) and parameter.to_local().numel() < parameter.numel()
            )
            assert sharded, "the reference was left gathered"
    probe = trainer.logprobs_of([1, 10, 20, 30], [40, 50, 60])
    checkpoint = trainer.checkpoint_state()
    master = trainer.master_state()
    training = trainer.training_state()
    # a trainer of the ranks built afresh takes that state back (rank 0 reads, all load)
    resumed = build_trainer(ranks, Path(model_dir), config, reference)
    resumed.load_training_state(training if ranks.leader else None)
    reloaded = resumed.training_state()
    if ranks.leader:
        torch.save(
            {
                "metrics": metrics,
                "master": master,
                "checkpoint": checkpoint,
                "training": training,
                "reloaded": reloaded,
                "probe": probe,
                "world": ranks.world,
            },
            out,
        )
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
