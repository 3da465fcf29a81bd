"""The one exception type for a user's mistake, and the one redaction of secrets in what pasta prints or logs.

`PastaError`: entry points print it as ``error: <message>`` on one line, without a traceback, and exit with code 2
(see ``pasta.cli``). Raise it with one clear line that says what is wrong and how to fix it.

`redact(text)`: every error message and log line that can carry an endpoint's text goes through it (the teacher,
the judges, alpaca_eval's annotators, the server), and so does every reply of an endpoint before pasta keeps or
writes any of it (pasta.endpoints for the teacher's and the judge's, pasta.evaluation.quality for alpaca_eval's
annotators'). An endpoint may echo the request's `Authorization` header in its error body or its answer; redaction
masks the values of the secrets pasta knows (keys read through `register_secret`, and every environment variable
whose name says it holds a key or token) and anything shaped like a bearer token or an `sk-...` key.
`RedactingFilter` applies it to log records; `pasta.cli` installs it on the root logger's handlers.

`ArgumentParser`: the argparse parser of the commands that take flags (`python -m pasta.lang`, `python -m
pasta.models`, the scripts), whose usage mistakes are one ``error:`` line too.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import threading
from typing import NoReturn

MASK = "***"
# Shorter values would mask ordinary words; real keys are far longer.
_MIN_SECRET_CHARS = 8
_SECRET_ENV_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
_TOKEN_CHAR = r"[A-Za-z0-9._~+/=-]"
_SECRET_SHAPES = re.compile(
    # A token after "Bearer" or "Basic" holds a digit, a +/=_~ or a capital after its first letter: the words of
    # "a basic overview" or "Basic Understanding" are not masked.
    rf"(?P<prefix>\b(?:bearer|basic)\s+)(?={_TOKEN_CHAR}*?(?:[0-9+/=_~]|{_TOKEN_CHAR}(?-i:[A-Z]))){_TOKEN_CHAR}{{8,}}"
    r"|\bsk-[A-Za-z0-9_-]{8,}"
    r"|(?P<field>\b(?:api[_-]?key|x-api-key|authorization|access_token)[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9._~+/-]{8,}",
    re.IGNORECASE,
)

_secrets: set[str] = set()
_lock = threading.Lock()


class PastaError(Exception):
    """A user's mistake: printed as one line by the entry points, exit code 2."""


def register_secret(value: str | None) -> None:
    """Mask `value` wherever it appears from now on (an API key as it is read)."""
    if value and len(value) >= _MIN_SECRET_CHARS:
        with _lock:
            _secrets.add(value)


def register_env_secrets() -> None:
    """Register the values of environment variables named like keys: names ending in API_KEY, APIKEY, TOKEN,
    SECRET or PASSWORD (OPENAI_API_KEY, HF_TOKEN, ...).

    alpaca_eval's annotators read their keys from the environment themselves; this covers them.
    """
    for name, value in os.environ.items():
        if _SECRET_ENV_NAME.search(name):
            register_secret(value)


def _mask_shape(match: re.Match[str]) -> str:
    return (match.group("prefix") or match.group("field") or "") + MASK


def redact_secrets(text: str) -> str:
    """`text` with every registered secret (a key pasta read) replaced by ***; key-shaped strings are left alone."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)  # a key that contains another is masked whole
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def redact(text: str) -> str:
    """`text` with every known secret and every key-shaped string replaced by ***."""
    return _SECRET_SHAPES.sub(_mask_shape, redact_secrets(text))


def one_line(text: str) -> str:
    """`text` redacted, on one line (whitespace runs collapsed)."""
    return " ".join(redact(text).split())


class RedactingFilter(logging.Filter):
    """A handler filter that redacts each record's message and traceback text before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction() -> None:
    """Put a RedactingFilter on every handler of the root logger (idempotent; call after logging is set up)."""
    handlers = logging.getLogger().handlers
    for handler in handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a usage mistake (an unknown flag, a value of the wrong type, a missing argument) is
    one redacted `error:` line and exit code 2, as every other mistake a pasta command reports; argparse's own
    prints its usage block and `<prog>: error:`. `--help` prints the usage as before."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr, flush=True)
        sys.exit(2)
