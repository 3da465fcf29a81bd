"""A checked request's way through the engine and back as OpenAI's answer.

`submit` hands the engine one request per choice (429 when the queue is full); `collect` waits for every choice
and `AnswerHead.body` makes the one JSON body of stream false; `stream` yields server-sent events of OpenAI's
chunks, then `data: [DONE]`. Both watch the client and cancel what still runs once it has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from pasta.decoding import DecodeConfig, DecodeResult
from pasta.serving.engine import Engine
from pasta.serving.errors import APIError
from pasta.serving.middleware import mark_client_gone
from pasta.serving.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChoice,
    Delta,
    ErrorBody,
    ErrorInfo,
    PastaStats,
    Usage,
)
from pasta.serving.requests import EngineEvent, EngineRequest, Failed, Finished, TextDelta
from pasta.serving.scheduler import QueueFull, TooLarge

DISCONNECT_POLL_S = 0.5  # how often a running request checks whether its client is still there


class ClientGone(Exception):
    """The client closed its connection before its answer was done."""


@dataclass(frozen=True)
class Submitted:
    """One HTTP request in the engine: a request per choice, whose events arrive on `queue` as (choice, event)."""

    requests: list[EngineRequest]
    queue: asyncio.Queue


@dataclass(frozen=True)
class AnswerHead:
    """What every body of one answer shares, and the route's flavour of OpenAI's bodies."""

    response_id: str
    created: int
    model: str
    chat: bool  # /v1/chat/completions; else /v1/completions
    annotated: bool  # the request asked for the annotated text in each choice's pasta stats

    def body(self, finished: list[Finished], usage: Usage) -> ChatCompletion | Completion:
        """The whole answer of stream false."""
        if self.chat:
            choices = [ChatChoice(index=i, message=AssistantMessage(content=f.result.text),
                                  finish_reason=_finish_reason(f.result), pasta=self.pasta_stats(f.result))
                       for i, f in enumerate(finished)]
            return ChatCompletion(id=self.response_id, created=self.created, model=self.model, choices=choices,
                                  usage=usage)
        choices = [CompletionChoice(index=i, text=f.result.text, finish_reason=_finish_reason(f.result),
                                    pasta=self.pasta_stats(f.result)) for i, f in enumerate(finished)]
        return Completion(id=self.response_id, created=self.created, model=self.model, choices=choices, usage=usage)

    def chunk(self, index: int, text: str | None = None, role: bool = False,
              result: DecodeResult | None = None) -> str:
        """One server-sent event of choice `index`: a piece of text, or (with `result`) its end."""
        finish = _finish_reason(result) if result else None
        stats = self.pasta_stats(result) if result else None
        if self.chat:
            delta = Delta(role="assistant" if role else None, content=text)
            payload = ChatCompletionChunk(id=self.response_id, created=self.created, model=self.model, choices=[
                ChatChunkChoice(index=index, delta=delta, finish_reason=finish, pasta=stats)])
        else:
            payload = Completion(id=self.response_id, created=self.created, model=self.model, choices=[
                CompletionChoice(index=index, text=text or "", finish_reason=finish, pasta=stats)])
        return f"data: {payload.model_dump_json(exclude_none=True)}\n\n"

    def usage_chunk(self, usage: Usage) -> str:
        """The last event before `[DONE]` when the request set stream_options.include_usage."""
        kind = ChatCompletionChunk if self.chat else Completion
        payload = kind(id=self.response_id, created=self.created, model=self.model, choices=[], usage=usage)
        return f"data: {payload.model_dump_json(exclude_none=True)}\n\n"

    def pasta_stats(self, result: DecodeResult) -> PastaStats:
        stats = result.stats
        return PastaStats(num_tokens=stats.num_tokens, num_steps=stats.num_steps, num_threads=stats.num_threads,
                          theoretical_speedup=stats.theoretical_speedup, malformed=dict(stats.malformed),
                          finish_reason=stats.finish_reason, annotated=result.annotated if self.annotated else None)


def submit(engine: Engine, prompt_ids: list[int], configs: list[DecodeConfig]) -> Submitted:
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
    return Submitted(requests, queue)


class _Events:
    """A request's engine events, read while watching its client: `next` raises ClientGone once the client left.

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
                    raise ClientGone()
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(self.queue.get(), timeout=DISCONNECT_POLL_S)


async def collect(engine: Engine, raw: Request, submitted: Submitted) -> list[Finished]:
    """Every choice's end; a failed choice fails the request (500)."""
    finished: list[Finished | None] = [None] * len(submitted.requests)
    events = _Events(raw, submitted.queue)
    try:
        while any(f is None for f in finished):
            index, event = await events.next()
            if isinstance(event, Failed):
                raise APIError(500, event.reason, "server_error")
            if isinstance(event, Finished):
                finished[index] = event
    finally:
        _cancel_unfinished(engine, submitted.requests, finished)
    return finished


async def stream(engine: Engine, raw: Request, submitted: Submitted, head: AnswerHead, include_usage: bool) \
        -> AsyncIterator[str]:
    """OpenAI's chunks as server-sent events; requests still running when the client leaves are cancelled."""
    requests = submitted.requests
    done: list[Finished | None] = [None] * len(requests)
    failed = False
    events = _Events(raw, submitted.queue)
    try:
        if head.chat:
            for index in range(len(requests)):
                yield head.chunk(index, text="", role=True)
        while not failed and any(d is None for d in done):
            index, event = await events.next()
            if isinstance(event, TextDelta):
                yield head.chunk(index, text=event.text)
            elif isinstance(event, Finished):
                done[index] = event
                yield head.chunk(index, text=None if head.chat else "", result=event.result)
            else:
                failed = True
                error = ErrorBody(error=ErrorInfo(message=event.reason, type="server_error"))
                yield f"data: {error.model_dump_json()}\n\n"
        if not failed and include_usage:
            yield head.usage_chunk(usage(requests[0].prompt_ids, done))
        yield "data: [DONE]\n\n"
    except ClientGone:
        mark_client_gone(raw.scope)
    except (GeneratorExit, asyncio.CancelledError):  # stopped from outside: a write found the client gone
        mark_client_gone(raw.scope)
        raise
    finally:
        _cancel_unfinished(engine, requests, done)


def _cancel_unfinished(engine: Engine, requests: list[EngineRequest], done: list[Finished | None]) -> None:
    for request, finished in zip(requests, done, strict=True):
        if finished is None:
            engine.cancel(request)


def _finish_reason(result: DecodeResult) -> str:
    return "stop" if result.stats.ended else "length"


def usage(prompt_ids: list[int], finished: list[Finished]) -> Usage:
    completion_tokens = sum(f.result.stats.num_tokens for f in finished)
    return Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                 total_tokens=len(prompt_ids) + completion_tokens)
