"""The HTTP side of the server: OpenAI's routes over the engine, as a FastAPI app.

    POST /v1/chat/completions, POST /v1/completions   (stream false: one JSON body; true: server-sent events of
                                                       OpenAI's chunks, then `data: [DONE]`)
    GET /v1/models, GET /health, GET /metrics          (Prometheus text format)

FastAPI (on Starlette, served by uvicorn) gives request validation from the pydantic schemas in protocol.py,
server-sent events with client-disconnect detection, and an ASGI app that tests drive over a real socket;
writing that HTTP handling by hand would be more code and less correct. Every error is OpenAI's body
(`{"error": {"message", "type", "param", "code"}}`): 400 for a body that does not parse or validate, a setting out
of range or a prompt over the context, 404 for an unknown model or route, 429 when the queue is full (with a
retry-after header, which the openai client honours), 500 when the engine fails the request. n > 1 asks the engine
for n sequences of the same prompt (seed, seed + 1, ... when a seed is given).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from pasta.decoding import DecodeConfig, DecodeResult
from pasta.serving.engine import Engine
from pasta.serving.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ErrorBody,
    ErrorInfo,
    ModelCard,
    ModelList,
    PastaStats,
    Usage,
)
from pasta.serving.requests import EngineEvent, EngineRequest, Failed, Finished, TextDelta
from pasta.serving.scheduler import QueueFull, TooLarge

DISCONNECT_POLL_S = 0.5  # how often a running request checks whether its client is still there


@dataclass(frozen=True)
class ServeSettings:
    """What the API checks and fills in before a request reaches the engine."""

    model_name: str  # the `model` clients send (GET /v1/models lists it)
    decode: DecodeConfig  # the defaults: max_tokens, temperature, top_p, the async limits
    max_tokens_limit: int  # the largest max_tokens a request may ask
    max_n: int  # the most choices one request may ask
    context_length: int  # prompt + max_tokens must fit


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


class _ClientGone(Exception):
    pass


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=ErrorInfo(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return "the request body is not valid JSON", None
    first = errors[0] if errors else {}
    location = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(location) or None
    return f"{param or 'body'}: {first.get('msg', 'invalid request')}", param


def create_app(engine: Engine, settings: ServeSettings) -> FastAPI:
    """The app; its lifespan starts the engine's thread and stops it (failing what still runs) at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="pasta", lifespan=lifespan)
    started = int(time.time())
    metrics = engine.metrics
    tokenizer = engine.tokenizer

    @app.middleware("http")
    async def count_responses(request: Request, call_next):
        response = await call_next(request)
        if request.url.path.startswith("/v1/"):
            metrics.requests.labels(str(response.status_code)).inc()
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), "not_found" if exc.status_code == 404 else
                              "invalid_request_error")

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception):
        return error_response(500, f"internal error: {exc}", "server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": settings.model_name, "decode": engine.mode,
                **dataclasses.asdict(engine.state())}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=settings.model_name, created=started)])

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        _check(body, settings)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in body.messages]
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # a template that refuses this conversation (roles, order)
            raise APIError(400, f"the model's chat template rejects these messages: {exc}", param="messages") \
                from None
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await _serve(raw, body, prompt_ids, max_tokens, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        _check(body, settings)
        prompt_ids = tokenizer(body.prompt)["input_ids"]
        return await _serve(raw, body, prompt_ids, body.max_tokens, chat=False)

    async def _serve(raw: Request, body, prompt_ids: list[int], max_tokens: int | None, chat: bool):
        configs = _decode_configs(body, settings, prompt_ids, max_tokens)
        requests, queue = _submit(engine, prompt_ids, configs)
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            events = _stream(engine, raw, requests, queue, response_id, created, settings.model_name, body, chat)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"})
        try:
            finished = await _collect(engine, raw, requests, queue)
        except _ClientGone:
            return Response(status_code=499)
        usage = _usage(prompt_ids, finished)
        annotated = bool(body.pasta and body.pasta.annotated)
        if chat:
            choices = [ChatChoice(index=i, message=AssistantMessage(content=f.result.text),
                                  finish_reason=_finish_reason(f.result), pasta=_pasta_stats(f.result, annotated))
                       for i, f in enumerate(finished)]
            payload = ChatCompletion(id=response_id, created=created, model=settings.model_name, choices=choices,
                                     usage=usage)
        else:
            choices = [CompletionChoice(index=i, text=f.result.text, finish_reason=_finish_reason(f.result),
                                        pasta=_pasta_stats(f.result, annotated)) for i, f in enumerate(finished)]
            payload = Completion(id=response_id, created=created, model=settings.model_name, choices=choices,
                                 usage=usage)
        return JSONResponse(payload.model_dump(exclude_none=True))

    return app


def _check(body, settings: ServeSettings) -> None:
    if body.model != settings.model_name:
        raise APIError(404, f"the model {body.model!r} does not exist; this server serves {settings.model_name!r}",
                       param="model", code="model_not_found")
    if (field := body.unsupported()) is not None:
        raise APIError(400, f"{field} is not supported by this server", param=field)
    if body.n > settings.max_n:
        raise APIError(400, f"n={body.n} is over this server's limit of {settings.max_n}", param="n")


def _decode_configs(body, settings: ServeSettings, prompt_ids: list[int], max_tokens: int | None) \
        -> list[DecodeConfig]:
    """One DecodeConfig per choice: the server's defaults with the request's settings."""
    if not prompt_ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    base = settings.decode
    max_tokens = max_tokens or base.max_new_tokens
    if max_tokens > settings.max_tokens_limit:
        raise APIError(400, f"max_tokens={max_tokens} is over this server's limit of {settings.max_tokens_limit}",
                       param="max_tokens")
    if len(prompt_ids) + max_tokens > settings.context_length:
        raise APIError(400, f"this model's maximum context length is {settings.context_length} tokens; the prompt "
                       f"has {len(prompt_ids)} and max_tokens asks {max_tokens}", param="messages",
                       code="context_length_exceeded")
    sampling = base.sampling
    if body.temperature is not None:
        sampling = dataclasses.replace(sampling, temperature=body.temperature)
    if body.top_p is not None:
        sampling = dataclasses.replace(sampling, top_p=body.top_p)
    # OpenAI's max_tokens bounds usage.completion_tokens, which counts every thread's tokens: it caps all threads
    # together, not only the main one (chunk threads would otherwise add up to max_chunk_tokens each).
    max_total_tokens = min(base.max_total_tokens or max_tokens, max_tokens)
    configs = []
    for i in range(body.n):
        seed = body.seed + i if body.seed is not None else None
        configs.append(dataclasses.replace(base, max_new_tokens=max_tokens, max_total_tokens=max_total_tokens,
                                           stop_strings=tuple(body.stop or ()),
                                           sampling=dataclasses.replace(sampling, seed=seed)))
    return configs


def _submit(engine: Engine, prompt_ids: list[int], configs: list[DecodeConfig]) \
        -> tuple[list[EngineRequest], asyncio.Queue]:
    """Hand the engine one request per choice; their events arrive on the queue as (choice index, event)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, EngineEvent]] = asyncio.Queue()

    def emitter(index: int):
        def emit(event: EngineEvent) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop closed: the server is gone, nobody listens
                loop.call_soon_threadsafe(queue.put_nowait, (index, event))
        return emit

    requests: list[EngineRequest] = []
    try:
        for index, config in enumerate(configs):
            request = EngineRequest(list(prompt_ids), config, emitter(index))
            engine.submit(request)
            requests.append(request)
    except (QueueFull, TooLarge) as exc:
        for request in requests:
            engine.cancel(request)
        if isinstance(exc, TooLarge):
            raise APIError(400, str(exc), param="max_tokens") from None
        raise APIError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded",
                       headers={"retry-after": "1"}) from None
    return requests, queue


class _Events:
    """A request's engine events, read while watching its client: `next` raises _ClientGone once the client left.

    The client is checked every DISCONNECT_POLL_S whether or not events flow: a streamed answer's events keep
    coming, and its writes into a closed socket may not fail before the answer ends, so a check made only when no
    event came would let a disconnected request run to max_tokens."""

    def __init__(self, raw: Request, queue: asyncio.Queue):
        self.raw, self.queue = raw, queue
        self.checked_s = time.monotonic()

    async def next(self) -> tuple[int, EngineEvent]:
        while True:
            if time.monotonic() - self.checked_s >= DISCONNECT_POLL_S:
                self.checked_s = time.monotonic()
                if await self.raw.is_disconnected():
                    raise _ClientGone()
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(self.queue.get(), timeout=DISCONNECT_POLL_S)


async def _collect(engine: Engine, raw: Request, requests: list[EngineRequest], queue: asyncio.Queue) \
        -> list[Finished]:
    finished: list[Finished | None] = [None] * len(requests)
    events = _Events(raw, queue)
    try:
        while any(f is None for f in finished):
            index, event = await events.next()
            if isinstance(event, Failed):
                raise APIError(500, event.reason, "server_error")
            if isinstance(event, Finished):
                finished[index] = event
    finally:
        for request, done in zip(requests, finished, strict=True):
            if done is None:
                engine.cancel(request)
    return finished


async def _stream(engine: Engine, raw: Request, requests: list[EngineRequest], queue: asyncio.Queue,
                  response_id: str, created: int, model: str, body, chat: bool) -> AsyncIterator[str]:
    """OpenAI's chunks as server-sent events; requests still running when the client leaves are cancelled."""

    def chunk(index: int, text: str | None = None, role: bool = False, result: DecodeResult | None = None) -> str:
        finish = _finish_reason(result) if result else None
        stats = _pasta_stats(result, bool(body.pasta and body.pasta.annotated)) if result else None
        if chat:
            delta = Delta(role="assistant" if role else None, content=text)
            payload = ChatCompletionChunk(id=response_id, created=created, model=model, choices=[
                ChatChunkChoice(index=index, delta=delta, finish_reason=finish, pasta=stats)])
        else:
            payload = Completion(id=response_id, created=created, model=model, choices=[
                CompletionChoice(index=index, text=text or "", finish_reason=finish, pasta=stats)])
        return f"data: {payload.model_dump_json(exclude_none=True)}\n\n"

    done: list[Finished | None] = [None] * len(requests)
    failed = False
    events = _Events(raw, queue)
    try:
        if chat:
            for index in range(len(requests)):
                yield chunk(index, text="", role=True)
        while not failed and any(d is None for d in done):
            index, event = await events.next()
            if isinstance(event, TextDelta):
                yield chunk(index, text=event.text)
            elif isinstance(event, Finished):
                done[index] = event
                yield chunk(index, text=None if chat else "", result=event.result)
            else:
                failed = True
                error = ErrorBody(error=ErrorInfo(message=event.reason, type="server_error"))
                yield f"data: {error.model_dump_json()}\n\n"
        if not failed and body.stream_options and body.stream_options.include_usage:
            usage = _usage(requests[0].prompt_ids, done)
            kind = ChatCompletionChunk if chat else Completion
            payload = kind(id=response_id, created=created, model=model, choices=[], usage=usage)
            yield f"data: {payload.model_dump_json(exclude_none=True)}\n\n"
        yield "data: [DONE]\n\n"
    except _ClientGone:
        pass
    finally:
        for request, finished in zip(requests, done, strict=True):
            if finished is None:
                engine.cancel(request)


def _finish_reason(result: DecodeResult) -> str:
    return "stop" if result.stats.finish_reason in ("eos", "stop_string") else "length"


def _pasta_stats(result: DecodeResult, annotated: bool) -> PastaStats:
    stats = result.stats
    return PastaStats(num_tokens=stats.num_tokens, num_steps=stats.num_steps, num_threads=stats.num_threads,
                      theoretical_speedup=stats.theoretical_speedup, malformed=dict(stats.malformed),
                      finish_reason=stats.finish_reason, annotated=result.annotated if annotated else None)


def _usage(prompt_ids: list[int], finished: list[Finished]) -> Usage:
    completion_tokens = sum(f.result.stats.num_tokens for f in finished)
    return Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                 total_tokens=len(prompt_ids) + completion_tokens)
