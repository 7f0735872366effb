"""The tests' one fake vLLM: an OpenAI-style server on its own thread and event loop, whose
answers and faults a test scripts.

By default it answers like a vLLM serving one model that always says WORDS: chat
completions whole or streamed token by token (with the token ids and logprobs vLLM adds
when asked), text completions, /v1/models (with the LoRA adapters a test lists), the
sampling defaults on /v1/chat/completions/render, /weight_info and /health. A test changes
the answer to a chat request with `reply`, a function of the request's body giving:

- `Whole(body, status)`: one JSON answer, an error status included;
- `Stream(steps)`: SSE events sent one by one, between which it can `HOLD` (until
  `release()`, noticing a client that hangs up meanwhile: `hung_up`), wait some seconds,
  or `CUT` the connection mid-answer (the replica dies);
- `DROP`: the connection closed once the request is read, unanswered;
- `Raw(body, length)`: bytes as they are (not JSON, say), announcing `length` of them; more
  announced than sent cuts the answer short (a length that is not the body's closes the
  connection after it);
- None: the default answer.

`down()` refuses new connections and cuts open ones, as when a replica dies; `up()` listens
again on the same port. `requests` and `headers` keep every generation request it got.

FakeReplica adds the endpoints the learner publishes through (LoRA adapters loaded and
unloaded, a full reload, the version's label, the verification probe).

Raw asyncio rather than a web framework: the faults are on the wire, so the sockets must be
in hand. For what a real engine can show, tests use the real vLLM server.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import Enum
from http import HTTPStatus
from pathlib import Path
from typing import Any, Self

import orjson

from learner.layout import ADAPTER_CONFIG
from learner.vllm_server import free_port
from proxy.upstream.sampling import NEUTRAL

MODEL = "fake"
VERSION = "fake-v1"
WORDS = ["The", " answer", " is", " forty", "-two", "."]
TOKEN_IDS = [101, 102, 103, 104, 105, 106]
LOGPROBS = [-0.5, -0.25, -0.125, -1.0, -0.75, -0.0625]
PROMPT_IDS = list(range(1, 21))
ANSWER = "".join(WORDS)


@dataclass(frozen=True)
class Whole:
    body: Any  # sent as JSON
    status: int = 200


class Step(Enum):
    HOLD = "hold"  # wait for release(); a client hanging up meanwhile ends the answer
    CUT = "cut"  # abort the connection here, mid-answer


HOLD, CUT = Step.HOLD, Step.CUT


@dataclass(frozen=True)
class Stream:
    # SSE events (dicts), steps, or seconds to wait; `data: [DONE]` follows unless cut
    steps: list[dict[str, Any] | Step | float]


class Drop:
    """The connection closes unanswered (a kept-alive one the server closed as it was used)."""


DROP = Drop()


@dataclass(frozen=True)
class Raw:
    body: bytes  # sent as it is
    length: int | None = None  # announced in content-length (None: the body's)


Reply = Whole | Stream | Drop | Raw
# a chat request's body -> its reply (None: the default answer)
Replier = Callable[[dict[str, Any]], Reply | None]


# ---- vLLM's answer shapes


def logprobs_of(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    """A choice's `logprobs` as vLLM gives them: one entry per sampled token."""
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ]
    }


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def chunk(
    delta: dict[str, Any],
    *,
    token_ids: list[int] | None = None,
    logprobs: dict[str, Any] | None = None,
    finish: str | None = None,
    model: str = MODEL,
    **top: Any,
) -> dict[str, Any]:
    """One chat.completion.chunk for choice 0; `top`: fields beside `choices`."""
    choice: dict[str, Any] = {
        "index": 0,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": finish,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model}
    return {**head, "choices": [choice], **top}


def usage_chunk(prompt: int, completion: int, model: str = MODEL) -> dict[str, Any]:
    """The last chunk when the request asks for usage: no choices."""
    return {**chunk({}, model=model), "choices": [], "usage": usage(prompt, completion)}


def text_chunk(content: str, *, token_id: int, finish: str | None = None) -> dict[str, Any]:
    """A chunk of one token of text, with its id and a logprob."""
    return chunk(
        {"content": content},
        token_ids=[token_id],
        logprobs=logprobs_of([content], [-0.5]),
        finish=finish,
    )


def completion(
    message: dict[str, Any],
    *,
    token_ids: list[int] | None,
    logprobs: dict[str, Any] | None,
    prompt_ids: list[int] | None,
    counts: tuple[int, int],
    finish: str = "stop",
    model: str = MODEL,
    id_: str = "chatcmpl-fake",
) -> dict[str, Any]:
    """A whole chat.completion; `counts`: its usage (prompt and completion tokens)."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body: dict[str, Any] = {
        "id": id_,
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [choice],
        "usage": usage(*counts),
    }
    if prompt_ids is not None:
        body["prompt_token_ids"] = prompt_ids
    return body


def as_stream(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole answer as vLLM streams it: the role and prompt ids, the whole delta with its
    token ids and logprobs, the finish reason, then usage."""
    choice, model = answer["choices"][0], answer["model"]
    message = choice["message"]
    delta: dict[str, Any] = {}
    if message.get("content"):
        delta["content"] = message["content"]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    top = {"id": answer["id"], "model": model}
    return [
        chunk(
            {"role": "assistant", "content": ""}, prompt_token_ids=answer["prompt_token_ids"], **top
        ),
        chunk(delta, token_ids=choice["token_ids"], logprobs=choice["logprobs"], **top),
        chunk({}, finish=choice["finish_reason"], **top),
        {**chunk({}, **top), "choices": [], "usage": answer["usage"]},
    ]


def default_reply(request: dict[str, Any]) -> Reply:
    """WORDS, whole or token by token, with token ids, logprobs and usage where asked."""
    ids, lps = bool(request.get("return_token_ids")), bool(request.get("logprobs"))
    model = request.get("model", MODEL)
    if not request.get("stream"):
        message = {"role": "assistant", "content": ANSWER, "tool_calls": []}
        return Whole(
            completion(
                message,
                token_ids=TOKEN_IDS if ids else None,
                logprobs=logprobs_of(WORDS, LOGPROBS) if lps else None,
                prompt_ids=PROMPT_IDS if ids else None,
                counts=(len(PROMPT_IDS), len(TOKEN_IDS)),
                model=model,
            )
        )
    first = chunk({"role": "assistant", "content": ""}, model=model)
    if ids:
        first["prompt_token_ids"] = PROMPT_IDS
    steps: list[dict[str, Any] | Step | float] = [first]
    for i, (word, token, logprob) in enumerate(zip(WORDS, TOKEN_IDS, LOGPROBS, strict=True)):
        steps.append(
            chunk(
                {"content": word},
                token_ids=[token] if ids else None,
                logprobs=logprobs_of([word], [logprob]) if lps else None,
                finish="stop" if i == len(WORDS) - 1 else None,
                model=model,
            )
        )
    if (request.get("stream_options") or {}).get("include_usage"):
        steps.append(usage_chunk(len(PROMPT_IDS), len(TOKEN_IDS), model=model))
    return Stream(steps)


TEXT_COMPLETION = {
    "id": "cmpl-fake",
    "object": "text_completion",
    "created": 1,
    "model": MODEL,
    "choices": [{"index": 0, "text": " forty-two", "finish_reason": "stop"}],
    "usage": usage(3, 2),
}


# ---- the server


class FakeVLLM:
    def __init__(
        self, reply: Replier | None = None, *, model: str = MODEL, version: str | None = VERSION
    ) -> None:
        self.reply = reply
        # the model /v1/models lists, with these LoRA adapters loaded on it
        self.model = model
        self.adapters: list[str] = []
        # set: /v1/models answers this instead (a replica that cannot list its models)
        self.models_error: Whole | None = None
        # what /weight_info says (None: not served, as without weight transfer)
        self.version = version
        # every chat or text completion request: its body, and its headers (names lower case)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.targets: list[str] = []  # every request's method and target, query included
        self.hung_up = threading.Event()  # a client hung up on a held answer
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._released = asyncio.Event()
        self._open: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}

    def release(self) -> None:
        """Lets every held answer go on (and any held later)."""
        self._loop.call_soon_threadsafe(self._released.set)

    def up(self) -> None:
        self._call(self._up())

    def down(self) -> None:
        self._call(self._down())

    def __enter__(self) -> Self:
        self._thread.start()
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, work: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(work, self._loop).result(10)

    async def _up(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, "127.0.0.1", self.port, reuse_address=True, backlog=1024
        )

    async def _down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        open_, self._open = self._open, {}
        for writer, task in open_.items():
            writer.transport.abort()
            task.cancel()
        await asyncio.gather(*open_.values(), return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection's requests, kept alive until the client or a fault ends it."""
        task = asyncio.current_task()
        assert task is not None
        self._open[writer] = task
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                start, *lines = head.split("\r\n")
                method, target, _ = start.split(" ", 2)
                headers: dict[str, str] = {}
                for line in filter(None, lines):
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                assert "transfer-encoding" not in headers, "a chunked request: not read here"
                raw = await reader.readexactly(int(headers.get("content-length", 0)))
                self.targets.append(f"{method} {target}")
                reply = self._route(method, target.split("?")[0], headers, raw)
                if not await self._send(reply, reader, writer):
                    return  # the fault ended the connection
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed it, or down() cut it
        finally:
            self._open.pop(writer, None)
            writer.close()

    def _route(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> Reply:
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            body = orjson.loads(raw)
            self.requests.append(body)
            self.headers.append(headers)
            if path == "/v1/completions":
                return Whole(TEXT_COMPLETION)
            try:
                return (self.reply and self.reply(body)) or default_reply(body)
            except Exception as exc:  # a script's failure, shown to the test as vLLM's 500
                return Whole({"error": {"message": f"fake vLLM: {exc!r}"}}, 500)
        if method == "POST" and path == "/v1/chat/completions/render":
            # the sampling vLLM applies where a request sets none (served with --enable-scale-out)
            return Whole({"sampling_params": NEUTRAL})
        if path == "/weight_info" and self.version is not None:
            return Whole({"weight_version": self.version})
        if path == "/v1/models":
            return self.models_error or Whole(self._models())
        if path == "/health":
            return Whole({})
        return Whole({"error": {"message": "not found"}}, 404)

    def _models(self) -> dict[str, Any]:
        base = {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model}
        data = [{**base, "parent": None, "max_model_len": 2048}]
        for name in self.adapters:
            data.append({**data[0], "id": name, "root": f"/adapters/{name}", "parent": self.model})
        return {"object": "list", "data": data}

    async def _send(
        self, reply: Reply, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Sends `reply`; False once a fault has ended the connection."""
        if isinstance(reply, Drop):
            writer.transport.abort()
            return False
        if isinstance(reply, Raw):
            announced = len(reply.body) if reply.length is None else reply.length
            writer.write(_head(200, "application/json", announced) + reply.body)
            await writer.drain()
            if announced != len(reply.body):
                # more announced: the rest never comes; less: what follows is no answer
                writer.transport.abort()
                return False
            return True
        if isinstance(reply, Whole):
            body = orjson.dumps(reply.body)
            writer.write(_head(reply.status, "application/json", len(body)) + body)
            await writer.drain()
            return True
        writer.write(_head(200, "text/event-stream", None))
        for step in reply.steps:
            if step is CUT:
                writer.transport.abort()
                return False
            if step is HOLD:
                if not await self._hold(reader):
                    return False
            elif isinstance(step, int | float):
                await asyncio.sleep(step)  # the slow engine being played, not a wait
            else:
                await _event(writer, b"data: " + orjson.dumps(step) + b"\n\n")
        await _event(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")  # the last HTTP chunk: the answer is whole
        await writer.drain()
        return True

    async def _hold(self, reader: asyncio.StreamReader) -> bool:
        """Waits (30 s at most) for release(); False if the client hung up first. A client
        sends nothing while its answer comes, so anything read is its end."""
        released = asyncio.ensure_future(self._released.wait())
        ended = asyncio.ensure_future(reader.read(1))
        done, pending = await asyncio.wait(
            {released, ended}, timeout=30, return_when=asyncio.FIRST_COMPLETED
        )
        for future in pending:
            future.cancel()
        if ended in done:
            self.hung_up.set()
            return False
        return True


async def _event(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))  # one HTTP chunk, sent at once
    await writer.drain()


def _head(status: int, content_type: str, length: int | None) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    phrase = HTTPStatus(status).phrase
    return (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: {content_type}\r\n{framing}\r\n\r\n".encode()
    )


# ---- a model played by a script, token-exact with a real tokenizer

# the reply to a call, given its chat messages: an assistant message
Script = Callable[[list[dict[str, Any]]], dict[str, Any]]
LOGPROB = -0.25


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant message calling one tool, arguments serialised as vLLM's parsers do."""
    dumped = json.dumps(arguments, ensure_ascii=False)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": dumped}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def text(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def has_tool_result(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "tool" for m in messages)


class ToolLoopUpstream(FakeVLLM):
    """Plays the model in a harness's tool loop, since the tiny random model cannot be made
    to call a harness's tools on demand: `script` decides each reply, and the request and
    reply are rendered with the tiny model's real tokenizer and chat template (prompt and
    completion token ids, as vLLM would). If the proxy shows the model the conversation the
    model produced, each call's prompt starts with the previous call's prompt and completion,
    token for token; if a translation changes an echoed tool call by a space, it does not."""

    def __init__(self, tokenizer: Any, script: Script, *, model: str = "tiny") -> None:
        super().__init__(self._reply, model=model, version=None)
        self.tokenizer = tokenizer
        self.script = script

    def _reply(self, body: dict[str, Any]) -> Reply:
        answer = self.answer(body)
        return Stream([*as_stream(answer)]) if body.get("stream") else Whole(answer)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat completion for a request (what its streamed chunks add up to)."""
        messages, tools = body["messages"], body.get("tools")
        reply = self.script(messages)
        prompt = self._render(messages, tools, prompt=True)
        whole = self._render([*messages, reply], tools, prompt=False)
        assert whole.startswith(prompt), "the template must render the reply after the prompt"
        # the turn as the model writes it: up to its end-of-turn token, not the newline after
        completion_ids = self._ids(whole[len(prompt) :].removesuffix("\n"))
        prompt_ids = self._ids(prompt)
        tokens = [self.tokenizer.decode([i]) for i in completion_ids]
        return completion(
            reply,
            token_ids=completion_ids,
            logprobs=logprobs_of(tokens, [LOGPROB] * len(tokens)),
            prompt_ids=prompt_ids,
            counts=(len(prompt_ids), len(completion_ids)),
            finish="tool_calls" if reply.get("tool_calls") else "stop",
            model=self.model,
            id_=f"chatcmpl-scripted-{len(self.requests)}",
        )

    def _render(self, messages: list[dict[str, Any]], tools: Any, *, prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=prompt, tokenize=False
        )

    def _ids(self, text_: str) -> list[int]:
        return list(self.tokenizer(text_, add_special_tokens=False)["input_ids"])


# ---- a replica the learner publishes into

PROBE_LOGPROB = -1.0  # every probe token's logprob, unless an adapter's config names another


class FakeReplica(FakeVLLM):
    """FakeVLLM with the endpoints the learner's publishers call, for learner tests without an
    engine: LoRA adapters loaded and unloaded at runtime by name, as vLLM does (listed with
    the directory they came from; a name loaded already, a directory it cannot read, refused),
    a full reload (pause, reload_weights, reset_prefix_cache, resume), the weight version's
    label, and the verification probe. It holds no model: the probe's every token has
    PROBE_LOGPROB, or for an adapter the `probe_logprob` its adapter_config.json names (read
    at load, as vLLM reads the files then), so a test that publishes through it sets the
    learner's tolerance wide enough for any probe to pass, or writes the logprob it means.
    No exact weight check (a vLLM started without the extension); what a real engine
    verifies is tests/e2e's.

    `paths`: each loaded adapter's directory (`adapters`: their names); `loads`: every
    adapter name loaded, in order; `controls`: every pause, resume and abort (the next
    `refuse_controls` of them answer 500); `reloads`: every full checkpoint reloaded (the next
    `refuse_reloads` answer 500); `version`: the
    label it serves; a directory under one of `unreadable` does not exist for it (a replica
    on another machine); a name in `refuse` fails to load (500)."""

    def __init__(self, *, model: str = MODEL) -> None:
        super().__init__(model=model)  # its `adapters = []` starts `paths`
        self.logprobs: dict[str, float] = {}
        self.loads: list[str] = []
        self.reloads: list[str] = []
        self.unreadable: list[Path] = []
        self.refuse: set[str] = set()
        self.controls: list[str] = []  # every pause, resume and abort, in order
        self.refuse_controls = 0  # so many of the next of them answer 500
        self.refuse_reloads = 0  # so many of the next full reloads answer 500

    @property
    def adapters(self) -> list[str]:
        """What it has loaded: `paths`' names (one record, so a test can drop either)."""
        return list(self.paths)

    @adapters.setter
    def adapters(self, names: list[str]) -> None:
        self.paths: dict[str, str] = {name: f"/adapters/{name}" for name in names}

    def _route(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> Reply:
        body: Any = orjson.loads(raw) if raw else {}
        if method == "POST" and path == "/v1/load_lora_adapter":
            return self._load(body["lora_name"], Path(body["lora_path"]))
        if method == "POST" and path == "/v1/unload_lora_adapter":
            if self.paths.pop(body["lora_name"], None) is None:
                message = f"The lora adapter '{body['lora_name']}' cannot be found."
                return vllm_error("NotFoundError", message, 404)
            return Whole({})
        if method == "POST" and path == "/v1/completions" and "prompt_logprobs" in body:
            return Whole(self._probe_answer(body))
        if method == "POST" and path == "/update_weight_version":
            self.version = body["new_version"]
            return Whole({})
        if method == "POST" and path == "/collective_rpc":
            if body["method"] != "reload_weights":  # a vLLM without the weight check's extension
                return Whole({"error": {"message": f"no method {body['method']}"}}, 400)
            if self.refuse_reloads:
                self.refuse_reloads -= 1
                return vllm_error("InternalServerError", "reload failed", 500)
            self.reloads.append(body["kwargs"]["weights_path"])
            return Whole({"results": [None]})
        if method == "POST" and path == "/reset_prefix_cache":
            return Whole({"success": True})
        if method == "POST" and path in ("/pause", "/resume", "/abort_requests"):
            self.controls.append(path.lstrip("/"))
            if self.refuse_controls:
                self.refuse_controls -= 1
                return vllm_error("InternalServerError", "engine busy", 500)
            return Whole({})
        return super()._route(method, path, headers, raw)

    def _load(self, name: str, path: Path) -> Reply:
        if name in self.paths:
            message = f"The lora adapter '{name}' has already been loaded."
            return vllm_error("InvalidUserInput", message, 400)
        if not path.is_dir() or any(path.is_relative_to(u) for u in self.unreadable):
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return vllm_error("NotFoundError", message, 404)
        if name in self.refuse:
            return vllm_error("InternalServerError", "engine refused the adapter", 500)
        config = path / ADAPTER_CONFIG
        named = json.loads(config.read_text()).get("probe_logprob") if config.is_file() else None
        self.logprobs[name] = PROBE_LOGPROB if named is None else float(named)
        self.paths[name] = str(path)
        self.loads.append(name)
        return Whole({})

    def _models(self) -> dict[str, Any]:
        models = super()._models()
        for model in models["data"]:
            if model["id"] in self.paths:
                model["root"] = self.paths[model["id"]]
        return models

    def _probe_answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """A text completion with `prompt_logprobs` for the probe's tokens (none for the
        first), as the model or adapter it names scores them."""
        logprob = self.logprobs.get(body.get("model", ""), PROBE_LOGPROB)
        entries: list[Any] = [None]
        entries += [{str(t): {"logprob": logprob, "rank": 1}} for t in list(body["prompt"])[1:]]
        choice = {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": entries}
        return {"id": "cmpl-probe", "object": "text_completion", "choices": [choice]}


def vllm_error(kind: str, message: str, status: int) -> Whole:
    """An error as vLLM's OpenAI server answers it."""
    return Whole(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status
    )
