"""The HTTP side of the server: OpenAI's routes over the engine, as a FastAPI app.

    POST /v1/chat/completions, POST /v1/completions   (stream false: one JSON body; true: server-sent events of
                                                       OpenAI's chunks, then `data: [DONE]`)
    GET /v1/models, GET /health, GET /metrics          (Prometheus text format)

FastAPI (on Starlette, served by uvicorn) gives request validation from the pydantic schemas in protocol.py,
server-sent events with client-disconnect detection, and an ASGI app that tests drive over a real socket;
writing that HTTP handling by hand would be more code and less correct. Every error is OpenAI's body
(`{"error": {"message", "type", "param", "code"}}`): 400 for a body that does not parse or validate, a setting out
of range or a prompt over the context, 404 for an unknown model or route, 413 for a body over
`limits.max_body_bytes` (before it is parsed), 429 when the queue is full (with a
retry-after header, which the openai client honours), 500 when the engine fails the request. n > 1 asks the engine
for n sequences of the same prompt (seed, seed + 1, ... when a seed is given).

This module checks a request and turns it into decode configs; answers.py takes it through the engine and back as
OpenAI's bodies and chunks, errors.py answers every failure.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from pasta.decoding import DecodeConfig
from pasta.errors import PastaError
from pasta.models import encode_chat, encode_text_prompt
from pasta.serving.answers import AnswerHead, ClientGone, collect, stream, submit, usage
from pasta.serving.engine import Engine
from pasta.serving.errors import APIError, add_error_handlers
from pasta.serving.middleware import CountResponses, LimitBodySize
from pasta.serving.protocol import (
    MAX_SEED,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ModelCard,
    ModelList,
)


@dataclass(frozen=True)
class ServeSettings:
    """What the API checks and fills in before a request reaches the engine."""

    model_name: str  # the `model` clients send (GET /v1/models lists it)
    decode: DecodeConfig  # the defaults: max_tokens, temperature, top_p, the async limits
    max_tokens_limit: int  # the largest max_tokens a request may ask
    max_n: int  # the most choices one request may ask
    context_length: int  # prompt + max_tokens must fit
    max_body_bytes: int | None = None  # a larger request body gets 413 before it is parsed; None: no cap


def create_app(engine: Engine, settings: ServeSettings) -> FastAPI:
    """The app; its lifespan starts the engine's thread and stops it (failing what still runs) at shutdown."""
    app = FastAPI(title="pasta", lifespan=_lifespan(engine))
    if settings.max_body_bytes is not None:
        app.add_middleware(LimitBodySize, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(CountResponses, metrics=engine.metrics)  # the outermost: it counts the 413s too
    add_error_handlers(app)
    _add_status_routes(app, engine, settings)
    _add_generation_routes(app, engine, settings)
    return app


def _lifespan(engine: Engine):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    return lifespan


def _add_status_routes(app: FastAPI, engine: Engine, settings: ServeSettings) -> None:
    """GET /health, /metrics and /v1/models."""
    started = int(time.time())

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": settings.model_name, "decode": engine.mode,
                **dataclasses.asdict(engine.state())}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=settings.model_name, created=started)])


def _add_generation_routes(app: FastAPI, engine: Engine, settings: ServeSettings) -> None:
    """POST /v1/chat/completions and /v1/completions."""
    tokenizer = engine.tokenizer

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        _check(body, settings, engine)
        # Off the event loop: a long prompt's template and tokenization would hold every other request meanwhile.
        prompt_ids = await run_in_threadpool(_chat_prompt_ids, tokenizer, body.messages)
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await _answer(engine, settings, raw, body, prompt_ids, max_tokens, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        _check(body, settings, engine)
        prompt_ids = await run_in_threadpool(encode_text_prompt, tokenizer, body.prompt)
        return await _answer(engine, settings, raw, body, prompt_ids, body.max_tokens, chat=False)


def _chat_prompt_ids(tokenizer, messages: list[ChatMessage]) -> list[int]:
    """The conversation through the model's chat template, ready for the assistant's turn; a control token's text
    in a message stays text (pasta.models.prompts)."""
    conversation = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
    try:
        return encode_chat(tokenizer, conversation)
    except PastaError as exc:  # a template that refuses this conversation (roles, order), or no template
        reason = getattr(exc, "reason", exc)  # TemplateRefused's: the template's own words
        raise APIError(400, f"the model's chat template rejects these messages: {reason}", param="messages") \
            from None


async def _answer(engine: Engine, settings: ServeSettings, raw: Request, body, prompt_ids: list[int],
                  max_tokens: int | None, chat: bool):
    """The request's answer: one JSON body, or (stream true) server-sent events."""
    configs = _decode_configs(body, settings, prompt_ids, max_tokens)
    submitted = submit(engine, prompt_ids, configs)
    head = AnswerHead(response_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", created=int(time.time()),
                      model=settings.model_name, chat=chat, annotated=bool(body.pasta and body.pasta.annotated))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = stream(engine, raw, submitted, head, include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers={"cache-control": "no-cache"})
    try:
        finished = await collect(engine, raw, submitted)
    except ClientGone:
        return Response(status_code=499)
    return JSONResponse(head.body(finished, usage(prompt_ids, finished)).model_dump(exclude_none=True))


def _check(body, settings: ServeSettings, engine: Engine) -> None:
    if body.model != settings.model_name:
        raise APIError(404, f"the model {body.model!r} does not exist; this server serves {settings.model_name!r}",
                       param="model", code="model_not_found")
    if (field := body.unsupported()) is not None:
        raise APIError(400, f"{field} is not supported by this server", param=field)
    if body.n > settings.max_n:
        raise APIError(400, f"n={body.n} is over this server's limit of {settings.max_n}", param="n")
    # Each choice is a sequence of its own: more than the running and queued slots together is never admitted.
    limits = engine.scheduler.limits
    max_sequences = limits.max_running_requests + limits.max_queued_requests
    if body.n > max_sequences:
        raise APIError(400, f"n={body.n} can never be admitted: this server holds at most {max_sequences} sequences "
                       "(limits.max_running_requests + limits.max_queued_requests)", param="n")
    if body.seed is not None and body.seed + body.n - 1 > MAX_SEED:
        raise APIError(400, f"seed + n - 1 = {body.seed + body.n - 1} is over {MAX_SEED} (choice i samples with "
                       "seed + i)", param="seed")


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
    # together, not only the main one (chunk threads would otherwise add up to max_chunk_tokens each), and tags
    # too (no free_tag_tokens: a client is billed for what was sampled).
    max_total_tokens = min(base.max_total_tokens or max_tokens, max_tokens)
    configs = []
    for i in range(body.n):
        seed = body.seed + i if body.seed is not None else None
        configs.append(dataclasses.replace(base, max_new_tokens=max_tokens, max_total_tokens=max_total_tokens,
                                           free_tag_tokens=0,
                                           stop_strings=tuple(body.stop) if "stop" in body.model_fields_set
                                           else base.stop_strings,
                                           sampling=dataclasses.replace(sampling, seed=seed)))
    return configs
