"""The one interface every teacher implements: annotate a stream of responses, answer in request order.

A teacher gets `TeacherRequest`s (an Alpaca record's instruction, input and the response to annotate) and yields one
`TeacherReply` per request, in the order the requests came, reading requests lazily so that only a bounded number
are in flight at any time (a crash or Ctrl-C loses at most those). A reply is one of:

- an answer (`text`), which the annotation stage validates;
- a rejection the teacher itself knows about (`reject_reason`: truncated, refused, empty reply), written as a
  rejected record;
- a failed request (`error`): not an answer, so nothing is written and a rerun asks again.

A teacher that cannot go on (endpoint down after its retries, bad key, unknown model) raises `TeacherError`, a
`PastaError`: the stage stops with that one line after keeping everything answered so far.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pasta.errors import PastaError

# Reason codes of answers a teacher already knows to be unusable (`TeacherReply.reject_reason` is `code: detail`).
EMPTY_REPLY = "empty_reply"
REFUSED = "refused"
TRUNCATED = "truncated"
DIVERGED = "diverged"  # generation was stopped early: the answer had left the response's text


class TeacherError(PastaError):
    """The teacher cannot go on; the message says why and what to change."""


@dataclass(frozen=True)
class TeacherRequest:
    id: str  # the record's id (pasta.data.Record.id)
    instruction: str
    input: str
    response: str  # the original response, to be annotated without changing a character


@dataclass(frozen=True)
class TeacherReply:
    id: str
    text: str | None = (
        None  # the teacher's annotated response, before validation (kept for a rejected answer)
    )
    reject_reason: str | None = None  # the teacher gave no usable answer ("truncated: ...", "refused: ...")
    error: str | None = None  # the request failed; the record is left for a later run


class Teacher(ABC):
    """Annotates responses with PASTA-LANG tags (topics only: the stage measures `tokens=` itself)."""

    name: str  # the config group option: structural | hf | openai
    model: str  # what produced the annotation: a model id, or the rule set's version

    @abstractmethod
    def annotate(self, requests: Iterable[TeacherRequest]) -> Iterator[TeacherReply]:
        """One reply per request, in request order; requests are consumed lazily."""

    def close(self) -> None:  # noqa: B027 (optional hook: most teachers hold nothing to release)
        """Release clients, threads or models."""

    def __enter__(self) -> Teacher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
