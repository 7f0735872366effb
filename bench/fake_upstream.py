"""A minimal constant-answer OpenAI-style upstream on raw asyncio, so benchmarks measure the
proxy and not a model. Answers chat completions (whole or streamed, with the token ids and
logprobs vLLM adds when asked), the sampling defaults on /v1/chat/completions/render,
/v1/models, /weight_info and /health.

Run: python -m bench.fake_upstream --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

import orjson

WORDS = ["The", " answer", " is", " forty", "-two", "."]
TOKEN_IDS = [101, 102, 103, 104, 105, 106]
LOGPROBS = [-0.5, -0.25, -0.125, -1.0, -0.75, -0.0625]
PROMPT_IDS = list(range(1, 21))
# what vLLM's render answers under --generation-config vllm: its neutral sampling
# what vLLM's /v1/models says of the one model it serves
MODELS = (
    b'{"object":"list","data":[{"id":"fake","object":"model","owned_by":"vllm",'
    b'"root":"fake","parent":null,"max_model_len":2048}]}'
)
RENDERED = orjson.dumps(
    {"sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}}
)


def chat_body(request: dict) -> bytes:
    tokens = bool(request.get("return_token_ids"))
    logprobs = bool(request.get("logprobs"))
    choice: dict = {
        "index": 0,
        "message": {"role": "assistant", "content": "".join(WORDS), "tool_calls": []},
        "logprobs": None,
        "finish_reason": "stop",
    }
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": w, "logprob": lp, "bytes": list(w.encode()), "top_logprobs": []}
                for w, lp in zip(WORDS, LOGPROBS, strict=True)
            ]
        }
    if tokens:
        choice["token_ids"] = TOKEN_IDS
    body: dict = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": request.get("model", "fake"),
        "choices": [choice],
        "usage": {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26},
    }
    if tokens:
        body["prompt_token_ids"] = PROMPT_IDS
    return orjson.dumps(body)


def chat_stream(request: dict) -> bytes:
    tokens = bool(request.get("return_token_ids"))
    logprobs = bool(request.get("logprobs"))
    usage = bool((request.get("stream_options") or {}).get("include_usage"))
    head = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": request.get("model", "fake"),
    }
    events = []
    first = {
        **head,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    if tokens:
        first["prompt_token_ids"] = PROMPT_IDS
    events.append(first)
    for i, word in enumerate(WORDS):
        choice: dict = {
            "index": 0,
            "delta": {"content": word},
            "logprobs": None,
            "finish_reason": "stop" if i == len(WORDS) - 1 else None,
        }
        if logprobs:
            choice["logprobs"] = {
                "content": [
                    {
                        "token": word,
                        "logprob": LOGPROBS[i],
                        "bytes": list(word.encode()),
                        "top_logprobs": [],
                    }
                ]
            }
        if tokens:
            choice["token_ids"] = [TOKEN_IDS[i]]
        events.append({**head, "choices": [choice]})
    if usage:
        events.append(
            {
                **head,
                "choices": [],
                "usage": {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26},
            }
        )
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def respond(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 "
        + status.encode()
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def models_with(adapters: list[str]) -> bytes:
    """/v1/models of a server with these LoRA adapters loaded on its one model."""
    data = orjson.loads(MODELS)["data"]
    for name in adapters:
        data.append({**data[0], "id": name, "root": f"/adapters/{name}", "parent": "fake"})
    return orjson.dumps({"object": "list", "data": data})


async def handle(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    models: Callable[[], bytes | tuple[str, bytes]] | None = None,
    asked: list[dict] | None = None,
) -> None:
    """One connection's requests. `models`: what /v1/models answers (default MODELS; with
    a status line first: that status);
    `asked`: every chat completion request is appended to it."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path, _ = lines[0].split(b" ", 2)
            length = 0
            for line in lines[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            raw = await reader.readexactly(length) if length else b""
            if path == b"/v1/chat/completions" and method == b"POST":
                request = orjson.loads(raw)
                if asked is not None:
                    asked.append(request)
                if request.get("stream"):
                    writer.write(respond("200 OK", chat_stream(request), b"text/event-stream"))
                else:
                    writer.write(respond("200 OK", chat_body(request)))
            elif path == b"/v1/chat/completions/render" and method == b"POST":
                # the sampling vLLM applies where a request sets nothing (--enable-scale-out)
                writer.write(respond("200 OK", RENDERED))
            elif path == b"/weight_info":
                writer.write(respond("200 OK", b'{"weight_version":"fake-v1"}'))
            elif path == b"/v1/models":
                listed = MODELS if models is None else models()
                status, listed = listed if isinstance(listed, tuple) else ("200 OK", listed)
                writer.write(respond(status, listed))
            elif path == b"/health":
                writer.write(respond("200 OK", b'{"object":"list","data":[]}'))
            else:
                writer.write(respond("404 Not Found", b'{"error":{"message":"not found"}}'))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(host: str, port: int) -> None:
    server = await asyncio.start_server(handle, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
