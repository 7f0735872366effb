"""One recorded generation call, from the client's bytes to the record, for any dialect.

Invariant: every call a client key lets in (proxy/base/keys.py) produces exactly one CallRecord,
whatever happens: refused, failed upstream, answered, broken off mid-stream or cancelled by
the client. A call without a valid key is answered 401 and recorded nowhere: it is nobody's
traffic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.base.capture import (
    CHAT,
    Capture,
    ClientAsked,
    StreamAssembler,
    capture_response,
    prepare_upstream_body,
)
from proxy.base.compat_policy import Compat, fitting_output_limit
from proxy.base.errors import (
    BadRequest,
    ProxyError,
    UpstreamTimeout,
    UpstreamUnavailable,
    json_or_text,
    upstream_error_message,
)
from proxy.base.keys import upstream_view
from proxy.base.record import CallRecord
from proxy.base.requests import (
    conversation_key,
    parse_object,
    read_body,
    session_key,
    task_key,
)
from proxy.generation.dialect import Dialect, StreamWriter
from proxy.generation.fanout import FanoutStream, choice_response, fanout_eligible, split_capture
from proxy.generation.prompt_tokens import count_prompt
from proxy.generation.streaming import response_to_chunks
from proxy.recording.interaction import explicit_type
from proxy.recording.stitching import new_id
from proxy.state import ProxyState
from proxy.upstream import http1
from proxy.upstream.replicas import UPSTREAM_READ_ERRORS, Replica, UpstreamPool
from proxy.upstream.sampling import effective as effective_sampling
from proxy.upstream.teacher import Teacher
from store.json_types import JsonObject

log = logging.getLogger("onthejob.proxy")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# buffered streams are rebuilt with everything in them; the dialect's writer filters
_EVERYTHING = ClientAsked(token_ids=True, logprobs=True, stream_usage=True)


class Generation:
    def __init__(self, request: Request, dialect: Dialect) -> None:
        self.request = request
        self.dialect = dialect
        self.state: ProxyState = request.app.state.proxy
        self.t0 = time.perf_counter()
        self.record = CallRecord(
            id=new_id(), api=dialect.api, session_key=None, started_at=time.time()
        )
        # fan-out: how many choices are sampled for the client's one (1: no fan-out), and
        # the records of those the client does not get, recorded if the call succeeds
        self.fanout = 1
        self.siblings: list[CallRecord] = []
        # (adapter, client's model) when a LoRA adapter answered for the base model: the
        # client's name goes back into what it receives
        self.renamed: tuple[str, Any] | None = None
        # what the upstream's auth comes from (never a client key of ours)
        self.client_headers: Mapping[str, str] = request.headers
        # the adapter the call's tenant is served by (None: no tenant, or none set)
        self.tenant_adapter: str | None = None
        # the canary candidate the call is assigned to (None: no canary, or not its arm)
        self.candidate: str | None = None
        # the teacher the call is routed to (None: the served policy's), and the pool the
        # upstream response came from (released there)
        self.teacher: Teacher | None = None
        self.pool: UpstreamPool = self.state.pool
        self.asked = _EVERYTHING  # what the client asked for of the capture's fields

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    def finish(
        self, *, status: str = "ok", http_status: int = 200, error: str | None = None
    ) -> None:
        record = self.record
        record.status, record.http_status, record.error = status, http_status, error
        record.latency_ms = self.elapsed_ms()
        siblings = self.siblings if status == "ok" else []
        if siblings:
            record.group_key = f"fanout:{record.id}"
        self.state.recorder.record(record)
        for sibling in siblings:
            sibling.group_key = record.group_key
            sibling.latency_ms = record.latency_ms
            self.state.recorder.record(sibling)

    def fail(self, exc: ProxyError) -> Response:
        if isinstance(exc, UpstreamUnavailable | UpstreamTimeout):
            log.warning("%s %s: %s", self.dialect.api, self.record.id, exc.message)
        response = self.dialect.error(exc)
        self.record.response = json_or_text(bytes(response.body))
        self.finish(status="error", http_status=exc.status, error=exc.message)
        return response

    async def run(self) -> Response:
        record = self.record
        try:
            record.key_name = self.state.keys.identify(self.request.headers)
        except ProxyError as exc:
            return self.dialect.error(exc)
        self.client_headers = upstream_view(self.request.headers, record.key_name)
        try:
            record.session_key = session_key(self.request)
            record.task_key = task_key(self.request)
            record.interaction_type = explicit_type(self.request)
            record.user_agent = self.request.headers.get("user-agent")
            body = parse_object(await read_body(self.request, self.state.settings.max_body_bytes))
            record.request = body
            model = body.get("model")
            record.model = model if isinstance(model, str) else None
            record.stream = body.get("stream") is True
            record.context["client_headers"] = self.client_headers  # for upstream auth
            tenant = self.state.tenants.tenant_of(
                record.key_name, record.interaction_type, body, record.user_agent
            )
            if tenant is not None:
                record.tenant, self.tenant_adapter = tenant.name, tenant.serving_version
            upstream_body = await self.dialect.to_upstream(body, self.state, record)
        except ProxyError as exc:
            return self.fail(exc)
        except (TypeError, AttributeError, ValueError, KeyError) as exc:
            # a body of the wrong shape somewhere a translator did not check: still the
            # client's error, answered and recorded like any other
            log.info("%s %s: malformed body: %r", self.dialect.api, record.id, exc)
            return self.fail(BadRequest(f"malformed request body: {exc}", code="invalid_body"))
        api = self.dialect.capture_api
        upstream_body, asked = prepare_upstream_body(api, upstream_body)
        self.asked = asked
        self.teacher = self._teacher_for(api, upstream_body)
        if self.teacher is None:  # a teacher's call is in no canary arm, nor fanned out
            self.candidate = self._canary_candidate(api, upstream_body)
        fanout = self.state.settings.fanout
        if (
            fanout > 1
            and self.teacher is None
            and self.dialect.api == CHAT
            and fanout_eligible(body)
        ):
            self.fanout = upstream_body["n"] = fanout
        sticky = (
            conversation_key(record.session_key, api, upstream_body)
            if len(self.state.pool.replicas) > 1
            else None
        )
        if record.stream and self._buffer_stream(upstream_body, sticky):
            upstream_body["stream"] = False
            upstream_body.pop("stream_options", None)
            return await self._buffered_stream(upstream_body, asked, sticky)
        try:
            replica, response = await self._open(upstream_body, sticky)
        except ProxyError as exc:
            return self.fail(exc)
        if response.status != 200 or not record.stream:
            return await self._whole(response, asked)
        writer = self.dialect.stream(asked, record)
        if self.fanout > 1:
            writer = FanoutStream(writer)
        return StreamingResponse(
            self._relay(replica, response, writer, bool(upstream_body.get("tools"))),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    def _canary_candidate(self, api: str, upstream_body: JsonObject) -> str | None:
        """The candidate of the canary running for the call's scope, if the call's session
        (else its conversation's opening, else the call itself) is in its arm
        (proxy/upstream/canary_assignment.py)."""
        canaries, record = self.state.canaries, self.record
        if not canaries.runs_for(record.tenant):
            return None  # the hot path: no key is hashed
        key = conversation_key(record.session_key, api, upstream_body)
        return canaries.candidate_for(record.tenant, key or record.id)

    def _teacher_for(self, api: str, upstream_body: JsonObject) -> Teacher | None:
        """The teacher, if it answers this call (proxy/upstream/teacher_assignment.py)."""
        teacher, record = self.state.teacher, self.record
        if teacher is None:
            return None  # the hot path: no key is hashed
        key = conversation_key(record.session_key, api, upstream_body)
        return teacher if teacher.answers(record.key_name, key or record.id) else None

    def _buffer_stream(self, body: JsonObject, sticky: str | None) -> bool:
        """Stream tool calls from a whole upstream answer where streaming loses their tokens."""
        if self.dialect.capture_api != CHAT or not body.get("tools"):
            return False
        mode = self.state.settings.stream_tools_mode
        if mode == "auto":
            return self.state.pool.candidates(sticky)[0].drops_stream_tool_tokens
        return mode == "buffer"

    async def _open(
        self, upstream_body: JsonObject, sticky: str | None
    ) -> tuple[Replica, http1.Response]:
        """Send the call upstream. For a translated API (whose clients cannot know the served
        model's context) an output limit vLLM refused as too large for the room the prompt
        leaves is lowered to what fits, and the call sent again; the record says so.

        A teacher's call goes to the teacher; where it is down or answers with an error,
        the served policy answers instead, and the call is recorded as the policy's."""
        if self.teacher is not None:
            opened = await self._open_teacher(self.teacher, upstream_body)
            if opened is not None:
                return opened
        replica, response = await self._send(upstream_body, sticky)
        limit, asked = self.dialect.output_limit, upstream_body.get("max_tokens")
        if response.status != 400 or limit is None or not isinstance(asked, int):
            return replica, response
        fitting = await self._fitting_output_limit(upstream_body, asked)
        if fitting is None:
            return replica, response  # refused for another reason: the client hears why
        await self.pool.release(response)
        upstream_body["max_tokens"] = fitting
        compat = self.record.compat = self.record.compat or Compat()
        compat.note("clamped", limit)
        compat.detail[limit] = {"asked": asked, "sent": fitting}
        return await self._send(upstream_body, sticky)

    async def _open_teacher(
        self, teacher: Teacher, upstream_body: JsonObject
    ) -> tuple[Replica, http1.Response] | None:
        """The teacher's answer, opened; None where it cannot give one (down, or an error
        status), before anything reached the client: then the served policy answers."""
        if not teacher.available():
            return self._without_teacher(teacher, "it is down")
        try:
            replica, response = await teacher.pool.open(
                "POST",
                self.dialect.upstream_path,
                body=teacher.body(upstream_body, self.asked),
                headers=teacher.headers(),
                sticky_key=None,
            )
        except ProxyError as exc:
            return self._without_teacher(teacher, exc.message)
        if response.status != 200:
            # its body is not logged: a hosted API's error may quote the key it was sent
            await teacher.pool.release(response)
            return self._without_teacher(teacher, f"it answered {response.status}")
        record = self.record
        record.upstream, record.teacher = replica.url, teacher.model
        record.policy_version = record.sampling = None  # no policy version answered it
        self.pool = teacher.pool
        requested = upstream_body.get("model")
        # the client sees the model it asked for, as with an adapter
        self.renamed = (teacher.model, requested) if isinstance(requested, str) else None
        return replica, response

    def _without_teacher(self, teacher: Teacher, why: str) -> None:
        log.warning(
            "%s %s: teacher %s did not answer (%s); the served policy answers instead",
            self.dialect.api,
            self.record.id,
            teacher.replica.url,
            why,
        )
        self.teacher = None
        return None

    async def _fitting_output_limit(self, upstream_body: JsonObject, asked: int) -> int | None:
        try:
            count = await count_prompt(self.state.pool, upstream_body, self.client_headers)
        except ProxyError as exc:
            log.info("%s %s: prompt not counted: %s", self.dialect.api, self.record.id, exc)
            return None
        if count.context is None:
            return None
        return fitting_output_limit(asked, prompt_tokens=count.tokens, context=count.context)

    async def _send(
        self, upstream_body: JsonObject, sticky: str | None
    ) -> tuple[Replica, http1.Response]:
        plain = orjson.dumps(upstream_body)
        requested = upstream_body.get("model")
        candidate = self.candidate

        def body_for(replica: Replica) -> bytes:
            # the version and the adapter read together, as the request leaves: the canary's
            # candidate or else the tenant's adapter where this replica has it loaded, else
            # the shared policy
            wanted = candidate if candidate in replica.adapters else self.tenant_adapter
            adapter = replica.serve_as(requested, wanted)
            tenants = adapter is not None and adapter == wanted
            self.record.policy_version = wanted if tenants else replica.policy_version
            self.record.sampling = effective_sampling(upstream_body, replica.sampling_defaults)
            self.renamed = None if adapter is None else (adapter, requested)
            return plain if adapter is None else orjson.dumps({**upstream_body, "model": adapter})

        replica, response = await self.state.pool.open(
            "POST",
            self.dialect.upstream_path,
            body=body_for,
            headers=self.state.pool.headers(self.client_headers),
            sticky_key=sticky,
            # a full-weight canary's arms, each to its own replicas (proxy/upstream/canaries.py)
            prefer=self.state.canaries.replica_preference(candidate),
        )
        self.record.upstream = replica.url
        return replica, response

    async def _read(self, response: http1.Response) -> bytes:
        try:
            return await response.read()
        except UPSTREAM_READ_ERRORS as exc:
            url = self.record.upstream
            if isinstance(exc, asyncio.TimeoutError | TimeoutError):
                raise UpstreamTimeout(f"upstream {url} timed out") from exc
            raise UpstreamUnavailable(f"upstream {url} broke off its answer: {exc}") from exc
        finally:
            await self.pool.release(response)

    async def _read_whole(
        self, response: http1.Response
    ) -> tuple[JsonObject | None, Response | None]:
        """(parsed 200 body, None) or (None, the response to send because it failed)."""
        try:
            raw = await self._read(response)
        except ProxyError as exc:
            return None, self.fail(exc)
        if response.status != 200:
            # vLLM's own errors reach the client (unchanged, or in the client API's shape)
            self.record.response = json_or_text(raw)
            self.finish(
                status="error", http_status=response.status, error=upstream_error_message(raw)
            )
            content_type = response.headers.get("Content-Type", "application/json")
            return None, self.dialect.upstream_error(response.status, raw, content_type)
        try:
            return self._restore_model(orjson.loads(raw)), None
        except orjson.JSONDecodeError:
            error = UpstreamUnavailable(f"upstream {self.record.upstream} sent invalid JSON")
            return None, self.fail(error)

    async def _whole(self, response: http1.Response, asked: ClientAsked) -> Response:
        data, failed = await self._read_whole(response)
        if data is None:
            assert failed is not None
            return failed
        data = self._capture(
            capture_response(self.dialect.capture_api, data),
            data,
            lambda part, record: self.dialect.whole(part, asked, record),
        )
        try:
            body = self.dialect.whole(data, asked, self.record)
        except ProxyError as exc:
            return self.fail(exc)
        self.record.response = body
        self.finish()
        return Response(orjson.dumps(body), media_type="application/json")

    async def _buffered_stream(
        self, upstream_body: JsonObject, asked: ClientAsked, sticky: str | None
    ) -> Response:
        try:
            _, response = await self._open(upstream_body, sticky)
        except ProxyError as exc:
            return self.fail(exc)
        data, failed = await self._read_whole(response)
        if data is None:
            assert failed is not None
            return failed
        writer = self.dialect.stream(asked, self.record)
        data = self._capture(
            capture_response(self.dialect.capture_api, data),
            data,
            lambda part, record: self.dialect.streamed(part, writer, record),
        )
        body = b"".join(writer.feed(c) for c in response_to_chunks(data, _EVERYTHING))
        body += writer.end()
        self.record.response = self.dialect.streamed(data, writer, self.record)
        self.record.ttft_ms = self.elapsed_ms()
        self.finish()

        async def emit() -> AsyncIterator[bytes]:
            yield body

        return StreamingResponse(emit(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _relay(
        self,
        replica: Replica,
        response: http1.Response,
        writer: StreamWriter,
        has_tools: bool,
    ) -> AsyncIterator[bytes]:
        """Pass chunks on as they arrive while assembling the whole answer for the record.

        The record is made before the stream's last bytes go out: a client that has seen
        the end of its answer can rely on the call being recorded.
        """
        assembler = StreamAssembler(self.dialect.capture_api)
        upstream_error: str | None = None
        buffer = b""
        done = False
        recorded = False

        def record(status: str, http_status: int, error: str | None) -> None:
            nonlocal recorded
            recorded = True
            self._finish_stream(replica, assembler, writer, has_tools, status, http_status, error)

        try:
            async for piece in response.content.iter_any():
                buffer += piece
                parts = []
                while not done and (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[:end], buffer[end + 2 :]
                    out, done, event_error = self._relay_event(event, assembler, writer)
                    upstream_error = upstream_error or event_error
                    parts.append(out)
                outgoing = b"".join(parts)
                if outgoing and self.record.ttft_ms is None and assembler.saw_output:
                    self.record.ttft_ms = self.elapsed_ms()
                if done:
                    await self.pool.release(response)
                    if upstream_error is not None:
                        record("error", 200, upstream_error)
                    else:
                        record("ok", 200, None)
                    yield outgoing
                    return
                if outgoing:
                    # one write per upstream read: what arrived together leaves together
                    yield outgoing
            error = f"upstream {replica.url} ended the stream before [DONE]"
            tail = writer.broken(error)
            await self.pool.release(response)
            record("error", 502, error)
            yield tail
        except UPSTREAM_READ_ERRORS as exc:
            error = f"upstream {replica.url} broke off the stream: {exc or type(exc).__name__}"
            tail = writer.broken(error)
            await self.pool.release(response)
            record("error", 502, error)
            yield tail
        finally:
            if not recorded:
                # the client left mid-stream (or the relay itself failed)
                await self.pool.release(response)
                record("cancelled", 499, "client disconnected mid-stream")

    def _finish_stream(
        self,
        replica: Replica,
        assembler: StreamAssembler,
        writer: StreamWriter,
        has_tools: bool,
        status: str,
        http_status: int,
        error: str | None,
    ) -> None:
        capture = assembler.finish()
        assembled = self._capture(
            capture,
            assembler.response(),
            lambda part, record: self.dialect.streamed(part, writer, record),
        )
        self.record.response = self.dialect.streamed(assembled, writer, self.record)
        if self.record.teacher is None:  # what the served model's replicas do, not a teacher
            self._learn_tool_token_drop(replica, has_tools, capture)
        self.finish(status=status, http_status=http_status, error=error)

    def _relay_event(
        self, event: bytes, assembler: StreamAssembler, writer: StreamWriter
    ) -> tuple[bytes, bool, str | None]:
        """(bytes for the client, whether it was [DONE], an upstream error message)."""
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        )
        if not data:
            return b"", False, None  # comments / keep-alives
        if data == b"[DONE]":
            return writer.end(), True, None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return b"", False, None
        if not isinstance(chunk, dict):
            return b"", False, None
        if "error" in chunk:
            message = upstream_error_message(data)
            return writer.upstream_error(event, message), False, message
        self._restore_model(chunk)
        assembler.add(chunk)
        return writer.feed(chunk), False, None

    def _restore_model(self, data: Any) -> Any:
        if self.renamed is not None and isinstance(data, dict):
            adapter, requested = self.renamed
            if data.get("model") == adapter:
                data["model"] = requested
        return data

    def _capture(
        self,
        capture: Capture,
        data: JsonObject,
        respond: Callable[[JsonObject, CallRecord], Any],
    ) -> JsonObject:
        """Take the upstream's capture; the upstream response the client's body comes from.

        Fanned out, the client's record keeps choice 0 and gets that choice alone as its
        response; every other choice becomes a sibling record with its own capture and the
        response `respond` makes for it (what the client would have received for it).
        """
        parts = split_capture(capture) if self.fanout > 1 else []
        if not parts or parts[0][0] != 0:
            self.record.capture = capture
            return data
        record = self.record
        for index, part in parts[1:]:
            sibling = CallRecord(
                id=new_id(),
                api=record.api,
                session_key=None,  # session feedback is about the answer the client got
                started_at=record.started_at,
                stream=record.stream,
                request=record.request,
                chat_messages=record.chat_messages,
                task_key=record.task_key,
                interaction_type=record.interaction_type,
                upstream=record.upstream,
                model=record.model,
                policy_version=record.policy_version,
                sampling=record.sampling,
                capture=part,
                fanout_parent=record.id,
                user_agent=record.user_agent,
                key_name=record.key_name,
                tenant=record.tenant,
            )
            sibling.response = respond(_choice_response(data, index, part), sibling)
            self.siblings.append(sibling)
        record.capture = parts[0][1]
        return _choice_response(data, 0, record.capture)

    def _learn_tool_token_drop(self, replica: Replica, has_tools: bool, capture: Capture) -> None:
        """`capture`: all choices the upstream streamed (fanned out: not just the client's)."""
        if (
            not has_tools
            or capture is None
            or capture.complete
            or capture.completion_tokens is None
        ):
            return
        if any((c.message or {}).get("tool_calls") for c in capture.choices):
            if not replica.drops_stream_tool_tokens:
                log.warning(
                    "upstream %s drops token ids of streamed tool calls; streaming requests "
                    "with tools to it are now answered from whole upstream responses",
                    replica.url,
                )
            replica.drops_stream_tool_tokens = True


def _choice_response(data: JsonObject, index: int, part: Capture) -> JsonObject:
    """The response for one fanned-out choice; its usage counts the tokens it sampled."""
    return choice_response(data, index, len(part.choices[0].token_ids))
