"""The token view of a trajectory: exactly what the learner trains on, with token texts.

Sequences come from store.samples.build_samples (the trainer's own stitching and loss
mask). Token texts are asked of the upstream vLLM (`POST /detokenize`, one id at a time,
cached for the process: a hot-swap changes weights, never the vocabulary); they are a
display aid and absent when the upstream cannot answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import aiohttp

from proxy.upstream.replicas import UpstreamPool
from store.samples import build_samples

log = logging.getLogger("onthejob.admin")

MAX_LOOKUPS = 4096  # distinct ids detokenized for one view, at most
CONCURRENCY = 16


def token_sequences(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per training sequence: token_ids, loss_mask, logprobs of equal length."""
    return [
        {
            "token_ids": s.token_ids,
            "loss_mask": s.loss_mask,
            "logprobs": s.logprobs,
            "trained_tokens": s.trained_tokens,
            "truncated": s.truncated,
            "sampling": dataclasses.asdict(s.sampling),
            "policy_versions": sorted(v for v in s.policy_versions if v is not None),
        }
        for s in build_samples(trajectory)
    ]


class Detokenizer:
    """Token id -> text, through the first healthy upstream, cached."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.pieces: dict[int, str] = {}
        self._model: str | None = None

    async def pieces_for(self, ids: set[int]) -> dict[int, str] | None:
        missing = sorted(i for i in ids if i not in self.pieces)[:MAX_LOOKUPS]
        if missing:
            try:
                await self._lookup(missing)
            except (aiohttp.ClientError, TimeoutError, KeyError, TypeError, ValueError) as exc:
                log.info("token texts unavailable: %s", exc)
                return None
        return {i: self.pieces[i] for i in ids if i in self.pieces}

    async def _lookup(self, ids: list[int]) -> None:
        # token texts do not depend on the weights: a gated replica may answer them
        replica = (self.pool.candidates(None) or self.pool.replicas)[0]
        session = self.pool.session
        timeout = aiohttp.ClientTimeout(total=10)
        if self._model is None:
            async with session.get(replica.url + "/v1/models", timeout=timeout) as response:
                response.raise_for_status()
                self._model = (await response.json())["data"][0]["id"]
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(token_id: int) -> None:
            async with limit:
                body = {"model": self._model, "tokens": [token_id]}
                async with session.post(
                    replica.url + "/detokenize", json=body, timeout=timeout
                ) as response:
                    response.raise_for_status()
                    self.pieces[token_id] = str((await response.json())["prompt"])

        await asyncio.gather(*(one(i) for i in ids))
