"""The `openai` teacher: any OpenAI-compatible chat-completions endpoint (OpenAI, Gemini's OpenAI-compatible API,
vLLM, SGLang, Ollama, llama.cpp server).

Up to `concurrency` requests run at once in threads and replies come back in request order; at most
2 * `concurrency` requests are taken ahead, so a crash loses at most those. Retries, errors and the API key follow
`pasta.endpoints.Endpoint`'s one policy (shared with the `openai` judge): transient failures that outlast the
client's `max_retries` and configuration errors stop the run with the reason (a `TeacherError`; a rerun resumes);
a request the server rejects on its own (400/422, e.g. a context too long) is left for a later run, and
`max_consecutive_errors` such rejections in a row stop the run. The key never reaches a log or an error line.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from pasta.endpoints import Endpoint, EndpointError, Rejection, RequestThreads
from pasta.teachers.base import (
    EMPTY_REPLY,
    REFUSED,
    TRUNCATED,
    Teacher,
    TeacherError,
    TeacherReply,
    TeacherRequest,
)
from pasta.teachers.prompt import TeacherPrompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenAITeacherConfig:
    """Settings of the API teacher (conf/teacher/openai.yaml). The key is read from the environment variable
    `api_key_env` names and never logged or written. Endpoints:

        OpenAI:   base_url=https://api.openai.com/v1  model=gpt-4o-mini  api_key_env=OPENAI_API_KEY
        Gemini:   base_url=https://generativelanguage.googleapis.com/v1beta/openai/  model=gemini-1.5-flash
                  api_key_env=GEMINI_API_KEY
        vLLM / SGLang / llama.cpp server / Ollama: base_url=http://localhost:8000/v1 (Ollama: :11434/v1)
                  api_key_env=null
    """

    kind: str = field(default="openai", metadata={"help": "teacher type: structural | hf | openai"})
    base_url: str = field(
        default="https://api.openai.com/v1", metadata={"help": "OpenAI-compatible API root"}
    )
    model: str = field(default="gpt-4o-mini", metadata={"help": "model name sent with every request"})
    api_key_env: str | None = field(
        default="OPENAI_API_KEY",
        metadata={"help": "environment variable holding the API key; null for a server that needs none"},
    )
    prompt: str = field(
        default="teacher_v2", metadata={"help": "prompt name in conf/prompts/ or a file path"}
    )
    concurrency: int = field(default=8, metadata={"help": "requests in flight at once"})
    max_retries: int = field(
        default=6, metadata={"help": "retries with backoff on 429, 5xx, timeouts, no connection"}
    )
    timeout_s: float = field(default=120.0, metadata={"help": "seconds before one request attempt times out"})
    temperature: float = field(
        default=0.0, metadata={"help": "sampling temperature; 0 = as deterministic as it gets"}
    )
    max_tokens: int | None = field(
        default=None,
        metadata={"help": "completion token limit; null = the server's. A cut answer is rejected"},
    )
    max_consecutive_errors: int = field(
        default=3, metadata={"help": "stop after this many rejected requests (400/422) in a row"}
    )


class OpenAITeacher(Teacher):
    name = "openai"

    def __init__(self, cfg: OpenAITeacherConfig):
        self.cfg = cfg
        self.model = cfg.model
        self.prompt = TeacherPrompt.load(cfg.prompt)
        self._endpoint = Endpoint("teacher", cfg)

    def annotate(self, requests: Iterable[TeacherRequest]) -> Iterator[TeacherReply]:
        iterator = iter(requests)
        window = 2 * self.cfg.concurrency  # keeps every worker busy while the oldest request is still running
        pending: deque[tuple[TeacherRequest, Future[TeacherReply]]] = deque()
        pool = RequestThreads(self.cfg.concurrency, "teacher")
        try:
            exhausted = False
            while True:
                while not exhausted and len(pending) < window:
                    request = next(iterator, None)
                    if request is None:
                        exhausted = True
                    else:
                        pending.append((request, pool.submit(self._ask, request)))
                if not pending:
                    return
                _, future = pending.popleft()
                try:
                    reply = future.result()
                except EndpointError as exc:
                    raise TeacherError(str(exc)) from None
                yield reply
        finally:
            for _, future in pending:
                future.cancel()
            pool.close()

    def _ask(self, request: TeacherRequest) -> TeacherReply:
        completion = self._endpoint.chat(
            self.prompt.messages(request.instruction, request.input, request.response),
            temperature=self.cfg.temperature,
            **({"max_tokens": self.cfg.max_tokens} if self.cfg.max_tokens is not None else {}),
        )
        if isinstance(completion, Rejection):
            log.warning("record %s: %s answered %s", request.id, self._endpoint.where, completion)
            return TeacherReply(request.id, error=str(completion))
        if not completion.choices:
            return TeacherReply(request.id, reject_reason=f"{EMPTY_REPLY}: the answer has no choices")
        choice = completion.choices[0]
        text = choice.message.content
        refusal = getattr(choice.message, "refusal", None)
        if refusal:
            return TeacherReply(request.id, text=text, reject_reason=f"{REFUSED}: {refusal[:200]}")
        if choice.finish_reason == "content_filter":
            return TeacherReply(
                request.id, text=text, reject_reason=f"{REFUSED}: the server's content filter"
            )
        if choice.finish_reason == "length":
            return TeacherReply(
                request.id,
                text=text,
                reject_reason=f"{TRUNCATED}: the answer hit the token limit (finish_reason=length)",
            )
        return TeacherReply(request.id, text=text)

    def close(self) -> None:
        self._endpoint.close()
