"""bench/gpu_learner.py, the GPU check prepared for a session lent the device: it must run
there as it is, so it runs here on CPU with small shapes and tiny sequences."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_learner
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow


def test_imports_nothing_the_gpu_machine_lacks() -> None:
    # there: torch, transformers and peft; not the store, nor the proxy
    code = (
        "import sys, bench.gpu_learner; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'proxy', "
        "'psycopg', 'fastapi', 'vllm')); "
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_small_run_measures_both_models(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    argv = ["--small", "--samples", "2", "--prompt-tokens", "24", "--completion-tokens", "16"]
    argv += ["--warmup", "0", "--repeats", "1", "--device", "cpu", "--json", str(out)]
    assert gpu_learner.main(argv) == 0

    results = json.loads(out.read_text())
    small, lora = results["0.5b"], results["7b"]
    for result in (small, lora):
        assert result["tokens_per_step"] == 2 * 40 and result["trained_tokens_per_step"] == 32
        assert result["grpo_tokens_per_s"] > 0 and result["bare_tokens_per_s"] > 0
        # the behaviour logprobs are the trainer's own: the first step is on-policy
        assert result["first_step"]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert result["logprobs_peak_bytes"] > 0 and result["bf16_logits_bytes"] > 0
        assert result["device_peak_bytes"] is None  # CUDA only
    # full weights on the 0.5B shape; an adapter, a small share of the weights, on the 7B one
    assert small["trainable_params"] == small["params"] and not small["lora"]
    # float32 masters (the full weights; the adapter on a bf16 base), a bf16 copy computes
    assert small["precision"] == lora["precision"] == "bfloat16"
    assert lora["lora"] and 0 < lora["trainable_params"] < lora["params"] / 50
    # the real vocabularies: what the logprob memory is about
    assert small["bf16_logits_bytes"] == 1 * 40 * 151936 * 2
