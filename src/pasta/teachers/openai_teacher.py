"""The `openai` teacher: any OpenAI-compatible chat-completions endpoint (OpenAI, Gemini's OpenAI-compatible API,
vLLM, SGLang, Ollama, llama.cpp server).

Up to `concurrency` requests run at once in threads and replies come back in request order; at most
2 * `concurrency` requests are taken ahead, so a crash loses at most those. Retries with exponential backoff on
429, 5xx, connection errors and timeouts are the openai client's own (`max_retries`, honouring the server's
retry-after headers; `timeout_s` per request). What still fails after them stops the run with the reason (a
`TeacherError`): the endpoint is down or over its limits, and a rerun resumes. A bad key, a forbidden or unknown
model stop it at once. A request the server rejects on its own (400/422, e.g. a context too long) is left for a later
run, and `max_consecutive_errors` such failures in a row stop the run, since then the configuration is wrong.

The API key is read from the environment variable named by `api_key_env` and is never logged or written anywhere.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import openai

from pasta.errors import PastaError
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

# Answers that no retry can change and that say the configuration is wrong.
_CONFIG_ERRORS = (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)
# Answers about this one request.
_REQUEST_ERRORS = (openai.BadRequestError, openai.UnprocessableEntityError)


@dataclass(frozen=True)
class OpenAITeacherConfig:
    """Settings of the API teacher (conf/teacher/openai.yaml)."""

    name: str = field(default="openai", metadata={"help": "teacher type: structural | hf | openai"})
    base_url: str = field(
        default="https://api.openai.com/v1", metadata={"help": "OpenAI-compatible API root"}
    )
    model: str = field(default="gpt-4o-mini", metadata={"help": "model name sent with every request"})
    api_key_env: str | None = field(
        default="OPENAI_API_KEY",
        metadata={"help": "environment variable holding the API key; null for a server that needs none"},
    )
    prompt: str = field(
        default="teacher_v1", metadata={"help": "prompt name in conf/prompts/ or a file path"}
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


def read_api_key(api_key_env: str | None) -> str:
    if api_key_env is None:
        return "not-needed"  # the client insists on a key; keyless local servers ignore it
    key = os.environ.get(api_key_env)
    if not key:
        raise PastaError(
            f"teacher.api_key_env={api_key_env}: the environment variable {api_key_env} is not set; export it, "
            "or set teacher.api_key_env=null for a server that needs no key"
        )
    return key


class OpenAITeacher(Teacher):
    name = "openai"

    def __init__(self, cfg: OpenAITeacherConfig):
        if cfg.concurrency < 1:
            raise PastaError(f"teacher.concurrency={cfg.concurrency} must be >= 1")
        self.cfg = cfg
        self.model = cfg.model
        self.prompt = TeacherPrompt.load(cfg.prompt)
        self._client = openai.OpenAI(
            base_url=cfg.base_url,
            api_key=read_api_key(cfg.api_key_env),
            max_retries=cfg.max_retries,
            timeout=cfg.timeout_s,
        )

    def annotate(self, requests: Iterable[TeacherRequest]) -> Iterator[TeacherReply]:
        iterator = iter(requests)
        window = 2 * self.cfg.concurrency  # keeps every worker busy while the oldest request is still running
        pending: deque[tuple[TeacherRequest, Future[TeacherReply]]] = deque()
        pool = ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="teacher")
        num_failed_in_a_row = 0
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
                reply = future.result()
                num_failed_in_a_row = num_failed_in_a_row + 1 if reply.error else 0
                if num_failed_in_a_row >= self.cfg.max_consecutive_errors:
                    raise TeacherError(
                        f"teacher {self.cfg.base_url} rejected {num_failed_in_a_row} requests in a row "
                        f"(last: {reply.error}); check teacher.model and the endpoint"
                    )
                yield reply
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def _ask(self, request: TeacherRequest) -> TeacherReply:
        where = f"teacher {self.cfg.model} at {self.cfg.base_url}"
        try:
            completion = self._client.chat.completions.create(
                model=self.cfg.model,
                messages=self.prompt.messages(request.instruction, request.input, request.response),
                temperature=self.cfg.temperature,
                **({"max_tokens": self.cfg.max_tokens} if self.cfg.max_tokens is not None else {}),
            )
        except _CONFIG_ERRORS as exc:
            raise TeacherError(
                f"{where}: {exc.status_code} {_message(exc)}; check the key, model and base_url"
            ) from None
        except _REQUEST_ERRORS as exc:
            log.warning("record %s: %s answered %s %s", request.id, where, exc.status_code, _message(exc))
            return TeacherReply(request.id, error=f"HTTP {exc.status_code}: {_message(exc)}")
        except openai.APITimeoutError:
            raise TeacherError(
                f"{where}: no answer within teacher.timeout_s={self.cfg.timeout_s} after "
                f"{self.cfg.max_retries} retries"
            ) from None
        except openai.APIConnectionError as exc:
            raise TeacherError(
                f"{where} is unreachable after {self.cfg.max_retries} retries ({exc.__cause__ or exc})"
            ) from None
        except openai.APIStatusError as exc:  # 429 and 5xx once the client's retries are spent
            raise TeacherError(
                f"{where}: {exc.status_code} {_message(exc)} after {self.cfg.max_retries} retries; rerun later to "
                "resume, or lower teacher.concurrency"
            ) from None
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
        self._client.close()


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return " ".join(str(error["message"]).split())[:300]
    return " ".join(str(exc.message).split())[:300]
