"""What our vLLM plugin fixes in vLLM-CPU, through the proxy on the real engine.

Seeded requests prefilled in chunks killed the engine (`CPU Generator does not use offset`):
learner/swap/vllm_seeded_sampling.py. (The LoRA fixes are tested where adapters serve:
prompt logprobs batched under LoRA on SmolLM2 in tests/e2e/test_real_model_vllm.py, base
requests batched with an adapter's in tests/e2e/test_lora_vllm.py.)
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import openai
import pytest

from learner.vllm_server import VLLMServer
from store import db
from tests.support.paths import ARTIFACTS

pytestmark = [pytest.mark.vllm]

PROMPT_TOKENS = 900  # 8 of them together pass vLLM-CPU's 2,048-token step budget: chunked
SAID = "a seeded request's prompt is prefilled in chunks"


def test_seeded_requests_prefilled_in_chunks_are_answered_and_keep_their_seed(
    vllm: VLLMServer, tmp_path: Path, start_proxy
) -> None:
    db_url = f"sqlite:///{tmp_path / 'calls.db'}"
    db.upgrade(db_url)
    proxy = start_proxy([vllm.url], db_url)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 500) for _ in range(PROMPT_TOKENS)] for _ in range(8)]
    log = ARTIFACTS / "vllm.log"

    async def run() -> tuple[list[str], list[str]]:
        api = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)

        async def one(seed: int) -> str:
            reply = await api.completions.create(
                model=vllm.model_name, prompt=prompts[seed], max_tokens=8, temperature=1.0,
                seed=seed,
            )  # fmt: skip
            return reply.choices[0].text

        try:
            for _ in range(5):  # without the fix: 500s, then a dead engine
                batched = await asyncio.gather(*(one(seed) for seed in range(8)))
                if SAID in log.read_text():  # said once by the engine, when it first happens
                    break
            else:
                raise AssertionError("vLLM never prefilled a seeded prompt in chunks")
            return batched, [await one(seed) for seed in range(8)]
        finally:
            await api.close()

    batched, alone = asyncio.run(run())
    assert httpx.get(vllm.url + "/health", timeout=10).status_code == 200
    # a seed means the same tokens, whether the prompt was split or not
    assert alone == batched
    assert len(set(alone)) > 1  # the seeds, not a constant answer
