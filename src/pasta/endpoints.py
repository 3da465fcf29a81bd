"""One OpenAI-compatible chat endpoint, shared by the `openai` teacher and the `openai` judge: settings, key, errors.

Both configs carry the same endpoint settings under the same names (`base_url`, `model`, `api_key_env`,
`concurrency`, `max_retries`, `timeout_s`, `max_consecutive_errors`) and `Endpoint` applies one error policy:

- 429, 5xx, timeouts and connection errors are retried by the openai client itself (`max_retries`, exponential
  backoff, honouring retry-after); what still fails stops the run with the reason (`EndpointError`): the endpoint
  is down or over its limits, and a rerun resumes;
- 401, 403 and 404 (a bad key, a forbidden or unknown model or URL) stop the run at once: no retry can help;
- 400 and 422 (the server rejects this one request, e.g. a context too long) fail that request only (`chat`
  returns a `Rejection`), and `max_consecutive_errors` of them in a row stop the run: then the configuration is
  wrong, not the request. Once stopped, the endpoint sends nothing more: every later call, and every rejection of
  a request already in flight, raises the same error (so the count it names is the limit, in whatever order the
  threads finished).

The key is read from the environment variable `api_key_env` names and registered with `pasta.errors.redact`, which
every message built here and every answer's text go through: an endpoint that echoes the Authorization header never
gets the key into an error line, a log or a record written from its answer.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pasta.errors import PastaError, one_line, redact_secrets, register_secret

# openai is imported where a client is made: every stage's start reads the endpoint configs' settings (the config
# schemas, check_endpoint_settings), and a command that makes no client need not pay for the import.


class EndpointError(PastaError):
    """The endpoint cannot be used now (down, over its limits, misconfigured); the message says why."""


@dataclass(frozen=True)
class Rejection:
    """The endpoint refused one request (400/422); the run goes on without it."""

    status_code: int
    message: str  # redacted, one line

    def __str__(self) -> str:
        return f"HTTP {self.status_code}: {self.message}"


def read_api_key(api_key_env: str | None, role: str) -> str:
    """The key in $`api_key_env` (registered for redaction); a placeholder when `api_key_env` is null."""
    if api_key_env is None:
        return "not-needed"  # the client insists on a key; keyless local servers ignore it
    key = os.environ.get(api_key_env)
    if not key:
        raise PastaError(
            f"{role}.api_key_env: the environment variable {api_key_env} is not set; export it, or set "
            f"{role}.api_key_env=null for a server that needs no key"
        )
    register_secret(key)
    return key


def check_endpoint_settings(role: str, cfg: Any) -> None:
    """One PastaError `<role>.<key>: <why>` for an endpoint setting of `cfg` out of range."""
    for key, low in (("concurrency", 1), ("max_retries", 0), ("max_consecutive_errors", 1)):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PastaError(f"{role}.{key}: must be an integer >= {low}, got {value!r}")
    if isinstance(cfg.timeout_s, bool) or not isinstance(cfg.timeout_s, (int, float)) or not cfg.timeout_s > 0:
        raise PastaError(f"{role}.timeout_s: must be a number > 0, got {cfg.timeout_s!r}")
    # Written so that NaN fails: a server refuses what it cannot sample with, on every request.
    if isinstance(cfg.temperature, bool) or not isinstance(cfg.temperature, (int, float)) or not cfg.temperature >= 0:
        raise PastaError(f"{role}.temperature: must be a number >= 0, got {cfg.temperature!r}")
    if cfg.max_tokens is not None and (isinstance(cfg.max_tokens, bool) or not isinstance(cfg.max_tokens, int)
                                       or cfg.max_tokens < 1):
        raise PastaError(f"{role}.max_tokens: must be an integer >= 1 or null, got {cfg.max_tokens!r}")
    for key in ("base_url", "model"):
        if not isinstance(getattr(cfg, key), str) or not getattr(cfg, key):
            raise PastaError(f"{role}.{key}: must be a non-empty string, got {getattr(cfg, key)!r}")


def error_message(exc: BaseException) -> str:
    """The server's own message of an API error (or the exception's text), redacted, on one line, at most 300 chars."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return one_line(str(error["message"]))[:300]
    return one_line(str(getattr(exc, "message", None) or exc))[:300]


class RequestThreads:
    """`num_threads` daemon threads that run the calls submitted to them, each call's result in its Future.

    Not concurrent.futures' ThreadPoolExecutor: Python joins its workers when the interpreter exits, so after Ctrl-C
    the process waited for every request in flight, up to `timeout_s` x retries each. A daemon thread's request goes
    with the process; what the run finished is on disk already, and a rerun resumes."""

    def __init__(self, num_threads: int, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._num_threads = num_threads
        for index in range(num_threads):
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():  # cancelled while it waited
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # the caller reads it from the Future
                future.set_exception(exc)

    def close(self) -> None:
        """The threads end after the calls submitted before (cancel the futures not wanted first); nothing waits."""
        for _ in range(self._num_threads):
            self._calls.put(None)

    def __enter__(self) -> RequestThreads:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _redacted(completion: Any) -> Any:
    """`completion` with the keys pasta read masked in its choices' text, before anything reads it: an answer that
    echoes the key (as an error body may) must not reach a record the teacher or the judge writes. Only those keys:
    masking key-shaped text too ("basic JavaScript", `api_key = "YOUR_API_KEY"`) would change the words of a
    response the teacher annotates, which is then rejected as text_changed."""
    for choice in getattr(completion, "choices", None) or ():
        message = getattr(choice, "message", None)
        for name in ("content", "refusal"):
            text = getattr(message, name, None)
            if isinstance(text, str):
                setattr(message, name, redact_secrets(text))
    return completion


class Endpoint:
    """An openai client for `role` ("teacher", "judge") with the module's error policy; thread-safe."""

    def __init__(self, role: str, cfg: Any):
        """`cfg`: a teacher or judge config dataclass with the endpoint settings as fields."""
        check_endpoint_settings(role, cfg)
        self.role, self.base_url, self.model = role, cfg.base_url, cfg.model
        self.max_retries, self.timeout_s = cfg.max_retries, cfg.timeout_s
        self.max_consecutive_errors = cfg.max_consecutive_errors
        import openai

        self._client = openai.OpenAI(
            base_url=cfg.base_url, api_key=read_api_key(cfg.api_key_env, role), max_retries=cfg.max_retries,
            timeout=cfg.timeout_s,
        )
        self._lock = threading.Lock()
        self._num_rejected_in_a_row = 0
        self._stopped: str | None = None  # the error that stopped the endpoint (see the module docstring)

    @property
    def where(self) -> str:
        return f"{self.role} {self.model} at {self.base_url}"

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> Any:
        """A chat completion, or a `Rejection` for a request the server refused; raises EndpointError to stop."""
        import openai

        if self._stopped is not None:
            raise EndpointError(self._stopped)
        try:
            completion = self._client.chat.completions.create(model=self.model, messages=messages, **kwargs)
        # Answers that no retry can change and that say the configuration is wrong.
        except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
            raise EndpointError(
                f"{self.where}: {exc.status_code} {error_message(exc)}; check the key, model and base_url"
            ) from None
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:  # about this one request
            return self._rejected(Rejection(exc.status_code, error_message(exc)))
        except openai.APITimeoutError:
            raise EndpointError(
                f"{self.where}: no answer within {self.role}.timeout_s={self.timeout_s} after {self.max_retries} "
                "retries; rerun later to resume"
            ) from None
        except openai.APIConnectionError as exc:
            raise EndpointError(
                f"{self.where} is unreachable after {self.max_retries} retries "
                f"({error_message(exc.__cause__ or exc)}); rerun later to resume"
            ) from None
        except openai.APIStatusError as exc:  # 429 and 5xx once the client's retries are spent
            raise EndpointError(
                f"{self.where}: {exc.status_code} {error_message(exc)} after {self.max_retries} retries; rerun "
                f"later to resume, or lower {self.role}.concurrency"
            ) from None
        with self._lock:
            self._num_rejected_in_a_row = 0
        return _redacted(completion)

    def _rejected(self, rejection: Rejection) -> Rejection:
        with self._lock:
            if self._stopped is None:
                self._num_rejected_in_a_row += 1
                if self._num_rejected_in_a_row >= self.max_consecutive_errors:
                    self._stopped = (f"{self.where} rejected {self._num_rejected_in_a_row} requests in a row (last: "
                                     f"{rejection}); check {self.role}.model and the endpoint")
            stopped = self._stopped
        if stopped is not None:
            raise EndpointError(stopped)
        return rejection

    def close(self) -> None:
        self._client.close()
