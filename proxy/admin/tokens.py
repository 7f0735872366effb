"""The token view of a trajectory: exactly what the learner trains on, with token texts.

Sequences come from store.samples.build_samples (the trainer's own stitching and loss
mask). Token texts come from the model's own tokenizer when `serve --tokenizer` names it
(read locally: it works while vLLM is down, e.g. to look at a finished demo's store), else
from the upstream vLLM (`POST /detokenize`, one id at a time). Either way they are cached for
the process (a hot-swap changes weights, never the vocabulary); they are a display aid and
absent when neither can answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import NotRequired, TypedDict, cast

import aiohttp

from proxy.upstream.replicas import UpstreamPool
from store.samples import build_samples
from store.trajectory_record import Trajectory

log = logging.getLogger("onthejob.admin")


class SamplingFields(TypedDict):
    """store/samples.py's Sampling as a dict."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float


class TokenSequence(TypedDict):
    """One training sequence of a trajectory, as the admin API shows it."""

    token_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    trained_tokens: int
    truncated: bool
    sampling: SamplingFields
    policy_versions: list[str]
    token_text: NotRequired[list[str | None] | None]  # added on request; None: no tokenizer


MAX_LOOKUPS = 4096  # distinct ids detokenized for one view, at most
CONCURRENCY = 16


def token_sequences(trajectory: Trajectory) -> list[TokenSequence]:
    """One entry per training sequence: token_ids, loss_mask, logprobs of equal length."""
    return [
        {
            "token_ids": s.token_ids,
            "loss_mask": s.loss_mask,
            "logprobs": s.logprobs,
            "trained_tokens": s.trained_tokens,
            "truncated": s.truncated,
            "sampling": cast(SamplingFields, dataclasses.asdict(s.sampling)),
            "policy_versions": sorted(v for v in s.policy_versions if v is not None),
        }
        for s in build_samples(trajectory)
    ]


def tokenizer_file(path: Path) -> Path:
    """A tokenizer.json, or the model directory that holds one."""
    candidate = path / "tokenizer.json" if path.is_dir() else path
    if not candidate.is_file():
        raise ValueError(f"no tokenizer.json at {path} (give a model directory or the file)")
    return candidate


class LocalTokenizer:
    """Token texts from the model's tokenizer.json (the `tokenizers` library: no model)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer  # only where a tokenizer is configured

        self._tokenizer = Tokenizer.from_file(str(tokenizer_file(path)))

    def lookup(self, ids: list[int], pieces: dict[int, str]) -> None:
        for token_id in ids:
            pieces[token_id] = self._tokenizer.decode([token_id], skip_special_tokens=False)


class Detokenizer:
    """Token id -> text, from the local tokenizer if there is one, else through the first
    healthy upstream; cached."""

    def __init__(self, pool: UpstreamPool, tokenizer: Path | None = None) -> None:
        self.pool = pool
        self.pieces: dict[int, str] = {}
        self._model: str | None = None
        self._tokenizer_path = tokenizer
        self._local: LocalTokenizer | None = None

    async def pieces_for(self, ids: set[int]) -> dict[int, str] | None:
        missing = sorted(i for i in ids if i not in self.pieces)[:MAX_LOOKUPS]
        if missing and self._tokenizer_path is not None:
            try:
                if self._local is None:
                    self._local = await asyncio.to_thread(LocalTokenizer, self._tokenizer_path)
                self._local.lookup(missing, self.pieces)
            except Exception as exc:  # a display aid: say why, then ask vLLM
                log.warning("the local tokenizer %s failed: %s", self._tokenizer_path, exc)
                self._tokenizer_path = None
            missing = []
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
