"""Admission: which requests run, which wait, and when the server says 429. No model, no threads of its own.

A request starts at once when it fits (fewer than `max_running_requests` running, and its `num_tokens` within
`max_tokens_in_flight` together with the running ones') and nobody waits before it; otherwise it waits in a FIFO
queue of at most `max_queued_requests`, and beyond that `submit` raises QueueFull (the API's 429). When a request
retires (finished, failed, cancelled) the queue's head starts as soon as it fits; later requests never overtake it,
so a long request is not starved by short ones. A request that could never fit is refused at once (TooLarge).
The API thread submits and cancels while the engine thread admits and retires: every method takes the lock.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from pasta.errors import PastaError


class Admissible(Protocol):
    @property
    def num_tokens(self) -> int: ...


class QueueFull(Exception):
    """Every running slot is taken and the waiting queue is at its bound."""


class TooLarge(Exception):
    """The request alone needs more tokens than the server ever holds in flight."""


@dataclass(frozen=True)
class AdmissionLimits:
    """How many sequences run and wait, and how many tokens they hold (conf/serve.yaml's `limits`)."""

    max_running_requests: int = field(default=16, metadata={"help": "sequences decoded together in one batch"})
    max_tokens_in_flight: int = field(
        default=65536, metadata={"help": "sum over running sequences of prompt + token budget"}
    )
    max_queued_requests: int = field(default=256, metadata={"help": "sequences waiting to start; beyond: 429"})

    def __post_init__(self) -> None:
        if self.max_running_requests < 1 or self.max_tokens_in_flight < 1:
            raise PastaError("max_running_requests and max_tokens_in_flight must be >= 1")
        if self.max_queued_requests < 0:
            raise PastaError("max_queued_requests must be >= 0")


class Scheduler:
    """Running and waiting requests under AdmissionLimits (see the module docstring)."""

    def __init__(self, limits: AdmissionLimits):
        self.limits = limits
        self._lock = threading.Lock()
        self._running: list[Admissible] = []
        self._started: list[Admissible] = []  # admitted since the engine last took them
        self._waiting: deque[Admissible] = deque()
        self._tokens_in_flight = 0

    def submit(self, request: Admissible) -> None:
        """Start the request, or queue it; raises QueueFull or TooLarge."""
        if request.num_tokens > self.limits.max_tokens_in_flight:
            raise TooLarge(f"the request needs {request.num_tokens} tokens (prompt + max_tokens) but the server "
                           f"holds at most {self.limits.max_tokens_in_flight} in flight")
        with self._lock:
            if not self._waiting and self._fits(request):
                self._start(request)
            elif len(self._waiting) < self.limits.max_queued_requests:
                self._waiting.append(request)
            else:
                raise QueueFull(f"{len(self._running)} requests running and {len(self._waiting)} waiting: "
                                "the server is at its limits, retry later")

    def take_started(self) -> list[Admissible]:
        """The requests admitted since the last call, in admission order (the engine adds them to its batch)."""
        with self._lock:
            started, self._started = self._started, []
            return started

    def retire(self, request: Admissible) -> None:
        """A running request ended (finished, failed or cancelled): free its room and start whoever fits."""
        with self._lock:
            if request in self._running:
                self._running.remove(request)
                self._tokens_in_flight -= request.num_tokens
                if request in self._started:
                    self._started.remove(request)
            self._promote()

    def withdraw(self, request: Admissible) -> bool:
        """Remove a request that is still waiting; False when it is running (the engine must retire it)."""
        with self._lock:
            if request in self._waiting:
                self._waiting.remove(request)
                self._promote()  # it may have been the head that blocked the others
                return True
            return False

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_tokens_in_flight(self) -> int:
        return self._tokens_in_flight

    def _fits(self, request: Admissible) -> bool:
        return (len(self._running) < self.limits.max_running_requests
                and self._tokens_in_flight + request.num_tokens <= self.limits.max_tokens_in_flight)

    def _promote(self) -> None:
        while self._waiting and self._fits(self._waiting[0]):
            self._start(self._waiting.popleft())

    def _start(self, request: Admissible) -> None:
        self._running.append(request)
        self._started.append(request)
        self._tokens_in_flight += request.num_tokens
