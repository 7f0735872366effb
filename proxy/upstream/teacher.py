"""The teacher: a stronger OpenAI-compatible upstream (another vLLM serving a bigger model,
or a hosted API) that answers chosen traffic instead of the served policy
(`serve --teacher-url`; which calls: proxy/upstream/teacher_assignment.py).

Its calls are recorded as usual, with `teacher` set to the model it was sent and no policy
version: they are supervised examples for the student, never on-policy samples. A hosted
teacher (`--teacher-hosted`) is sent no vLLM-only fields and returns no tokens: its calls
are recorded with their text alone.

Its key (`ONTHEJOB_TEACHER_API_KEY`) goes only into the Authorization header of requests
to the teacher: never a client's header, never logged, never recorded. Nothing of the
client's auth is sent to the teacher.
"""

from __future__ import annotations

import time

import orjson

from proxy.base.capture import ClientAsked
from proxy.settings import Settings
from proxy.upstream.replicas import Replica, UpstreamPool
from proxy.upstream.teacher_assignment import teacher_answers
from store.json_types import JsonObject

_NO_HEADERS: dict[str, str] = {}
# request fields only vLLM knows: a hosted API refuses a request with any of them
VLLM_ONLY = (
    "return_token_ids",
    "prompt_logprobs",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "top_k",
    "min_p",
    "repetition_penalty",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "min_tokens",
    "bad_words",
    "allowed_token_ids",
    "structured_outputs",
)


class Teacher:
    def __init__(self, settings: Settings) -> None:
        assert settings.teacher_url is not None and settings.teacher_model is not None
        key = settings.teacher_api_key
        self.pool = UpstreamPool(
            [settings.teacher_url],
            connect_timeout=settings.upstream_connect_timeout,
            total_timeout=settings.upstream_timeout,
            retry_after=settings.upstream_retry_after,
            api_key=None if key is None else key.get_secret_value(),
            learn_sampling=False,
        )
        self.model: str = settings.teacher_model
        self.hosted = settings.teacher_hosted
        self._keys = frozenset(settings.teacher_keys)
        self._share = settings.teacher_share

    @property
    def replica(self) -> Replica:
        return self.pool.replicas[0]

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    def answers(self, key_name: str | None, conversation: str) -> bool:
        """Whether the call is the teacher's (whether the teacher is up or not)."""
        return teacher_answers(key_name, conversation, keys=self._keys, share=self._share)

    def available(self) -> bool:
        """Up, or due to be tried again: while it is down its calls go to the served policy
        at once, not after a connect timeout each."""
        return self.replica.eligible(time.monotonic())

    def body(self, upstream_body: JsonObject, asked: ClientAsked) -> bytes:
        """What the teacher is sent: the call as the served policy would get it, for the
        teacher's model; for a hosted API without vLLM's fields (nor the logprobs the proxy
        asks vLLM for, unless the client asked for them)."""
        body = {**upstream_body, "model": self.model}
        if self.hosted:
            for name in VLLM_ONLY:
                body.pop(name, None)
            if not asked.logprobs:
                body.pop("logprobs", None)
        return orjson.dumps(body)

    def headers(self) -> dict[str, str]:
        """Its own key (if any), never the client's."""
        return self.pool.headers(_NO_HEADERS)
