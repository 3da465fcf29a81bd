"""The engine: one thread that owns the model and decodes every request in one continuous batch.

Each turn of its loop: cancelled requests leave, the requests the scheduler started join the running batch (an
interpreter and a cache row each), and the batch takes one step (`pasta.decoding.runner.StepBatch`: every member
plans its rows, one packed forward for all of them, a newcomer's prompt riding beside the others' decode rows
(pasta/decoding/packing.py), each member chooses its tokens with its own sampling settings and generator and commits
them); every member gets the text that became final, and finished ones leave at once (their cache rows freed; an
empty batch frees the whole cache). The thread sleeps while nothing runs.

What a step costs beyond the forward is kept to what the step added: the text that became final is rendered
incrementally (`pasta.decoding.render.SettledText`), and a member's event goes out only when its text grew.

A request whose own plan, sampling or commit raises fails alone (Failed; its row freed) and the others go on; a
forward that raises fails the requests of that step, since they shared it. A greedy answer does not depend on the
company a request keeps: its rows see only its own cache row, and a sampled one draws from the request's own
generator in a fixed order (the same tokens as `decode_async` with that seed).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from pasta.decoding import DecodeConfig
from pasta.decoding.asynchronous import choose_request_tokens, new_interpreter, request_result
from pasta.decoding.attention import ragged_attention
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.linears import multirow_linears
from pasta.decoding.plain import PlainInterpreter
from pasta.decoding.runner import RequestClock, StepBatch
from pasta.decoding.sampling import choose_tokens, request_generators
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.text import eos_token_ids, pad_token_id, text_decoder
from pasta.decoding.threads import ChunkState
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy
from pasta.serving.metrics import ServingMetrics
from pasta.serving.requests import EngineRequest, Failed, Finished, TextDelta
from pasta.serving.scheduler import AdmissionLimits, Scheduler

log = logging.getLogger(__name__)

MODES = ("async", "sequential")


@dataclass
class EngineState:
    """What the engine holds right now (/health, the metrics gauges, tests)."""

    num_running: int  # sequences in the batch
    num_waiting: int  # sequences queued for admission
    num_threads: int  # main threads plus running chunk threads
    num_tokens_in_flight: int  # admission tokens of the running sequences
    num_cache_rows: int  # batch rows of the KV cache
    kv_cache_bytes: int


@dataclass
class _Member:
    """A running request and its decoding state."""

    request: EngineRequest
    interpreter: Interpreter | PlainInterpreter
    generator: torch.Generator | None
    clock: RequestClock = field(default_factory=RequestClock)
    emitted: str = ""


class Engine:
    """Owns the model on its own thread; `submit` and `cancel` are called from the API's thread."""

    def __init__(self, model, tokenizer, *, mode: str, policy: ReservationPolicy | None = None,
                 limits: AdmissionLimits | None = None, metrics: ServingMetrics | None = None,
                 cpu_multirow_linears: bool = True):
        if mode not in MODES:
            raise PastaError(f"decode={mode} cannot be served; use one of {', '.join(MODES)}")
        self.model = model
        self.tokenizer = tokenizer
        self.mode = mode
        self.policy = policy or ReservationPolicy()
        self.scheduler = Scheduler(limits or AdmissionLimits())
        self.metrics = metrics or ServingMetrics()
        self.cpu_multirow_linears = cpu_multirow_linears
        self._eos_ids = eos_token_ids(model, tokenizer)
        self._decode = text_decoder(tokenizer)
        self._pad_id = pad_token_id(tokenizer)
        self._running = _Group(model, self._pad_id)  # the continuous batch
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.metrics.watch(
            live_requests=lambda: self.state().num_running, live_threads=lambda: self.state().num_threads,
            queue_depth=lambda: self.scheduler.num_waiting,
            tokens_in_flight=lambda: self.scheduler.num_tokens_in_flight,
            kv_cache_bytes=lambda: self.state().kv_cache_bytes,
        )

    # --- the API's side --------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pasta-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Fail whatever is still running or waiting and end the thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def submit(self, request: EngineRequest) -> None:
        """Queue a request; raises the scheduler's QueueFull or TooLarge."""
        if self._stopping:
            raise PastaError("the server is shutting down")
        self.scheduler.submit(request)
        self._wake.set()

    def cancel(self, request: EngineRequest) -> None:
        """The client is gone: drop the request (its slots are freed before the next step)."""
        request.cancelled = True
        if self.scheduler.withdraw(request):
            self.metrics.sequences.labels("cancelled").inc()
        self._wake.set()

    def state(self) -> EngineState:
        running = self._running
        members = list(running.members)
        cache = running.batch.cache
        return EngineState(
            num_running=len(members),
            num_waiting=self.scheduler.num_waiting,
            num_threads=sum(1 + _num_running_chunks(m.interpreter) for m in members),
            num_tokens_in_flight=self.scheduler.num_tokens_in_flight,
            num_cache_rows=0 if cache is None else cache.num_rows,
            kv_cache_bytes=0 if cache is None else cache.num_bytes(),
        )

    # --- the engine thread -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode(), ragged_attention(self.model), \
                multirow_linears(self.model, enabled=self.cpu_multirow_linears):
            while not self._stopping:
                self._wake.clear()
                try:
                    self._end(self._running, [(m, None) for m in self._running.members if m.request.cancelled])
                    self._admit()
                    if not self._running.members:
                        self._wake.wait()
                        continue
                    self._step(self._running)
                except Exception as exc:  # a bug outside any one request: fail what runs, keep serving
                    log.exception("engine step failed")
                    self._abandon(self._running.members, f"engine step failed: {exc}")
                    self._running = _Group(self.model, self._pad_id)
        for request in self.scheduler.take_started():
            request.emit(Failed("the server is shutting down"))
        self._end(self._running, [(m, Failed("the server is shutting down")) for m in self._running.members])

    def _admit(self) -> None:
        """The requests the scheduler started join the running batch: their prompts' prefill rides in the next
        step's forward, packed beside the running requests' decode rows (no padding to the prompts' length)."""
        for request in self.scheduler.take_started():
            if request.cancelled:
                self.scheduler.retire(request)
                self.metrics.sequences.labels("cancelled").inc()
                continue
            try:
                member = _Member(request, self._interpreter(request.prompt_ids, request.config),
                                 _generator(request.config, self.model.device))
            except Exception as exc:
                self.scheduler.retire(request)
                self.metrics.sequences.labels("failed").inc()
                request.emit(Failed(f"could not start the request: {exc}"))
                continue
            self._running.join(member, len(request.prompt_ids) + request.config.max_new_tokens + 64)

    def _interpreter(self, prompt_ids: list[int], config: DecodeConfig) -> Interpreter | PlainInterpreter:
        if self.mode == "async":
            return new_interpreter(self.model, self.tokenizer, prompt_ids, config, self.policy)
        return PlainInterpreter(prompt_ids, eos_ids=self._eos_ids, config=config, decode=self._decode,
                                capacity=len(prompt_ids) + config.max_new_tokens + 64, device=self.model.device)

    def _step(self, group: _Group) -> None:
        """One forward for every member of the group; ended members leave it."""
        started = time.perf_counter()
        plans, failures = [], []
        for member in group.members:
            try:
                plans.append(member.interpreter.plan())
            except Exception as exc:
                failures.append((member, Failed(f"planning the step failed: {exc}")))
                plans.append(None)
        if failures:
            plans = [p for p in plans if p is not None]
            self._end(group, failures)
            if not group.members:
                return
        members = list(group.members)
        try:
            packed = group.batch.prepare(plans)
            forward_started = time.perf_counter()
            logits = group.batch.forward(packed, plans)
            forward_s = time.perf_counter() - forward_started
        except Exception as exc:
            log.exception("forward failed")
            self._end(group, [(m, Failed(f"the forward failed: {exc}")) for m in members])
            return
        self.metrics.forward_steps.inc()
        self.metrics.step_rows.observe(sum(len(p.token_ids) for p in plans))
        ended, sampling_s = [], 0.0
        for member, plan, rows in zip(members, plans, logits, strict=True):
            try:
                sampling_started = time.perf_counter()
                token_ids = self._choose(member, plan, rows)
                sampling_s += time.perf_counter() - sampling_started
                member.interpreter.commit(plan, token_ids)
                self._send_text(member)
            except Exception as exc:
                ended.append((member, Failed(f"sampling or committing the step failed: {exc}")))
        elapsed = time.perf_counter() - started
        self.metrics.step_seconds.observe(elapsed)
        self.metrics.step_host_seconds.observe(elapsed - forward_s - sampling_s)
        for member in members:
            clock = member.clock
            if member.interpreter.num_steps == 1:
                clock.prefill_s = elapsed
            else:
                clock.decode_s += elapsed
            clock.bookkeeping_s += elapsed - forward_s - sampling_s
        failed = {id(m) for m, _ in ended}
        ended += [(m, Finished(request_result(m.interpreter, m.clock), len(m.request.prompt_ids)))
                  for m in members if m.interpreter.done and id(m) not in failed]
        self._end(group, ended)

    def _choose(self, member: _Member, plan: StepPlan, logits: torch.Tensor) -> list[int]:
        """The member's tokens from its rows' logits, with its own sampling settings and generator."""
        config = member.request.config
        if isinstance(member.interpreter, Interpreter):
            return choose_request_tokens(member.interpreter, self.tokenizer, logits, plan.sample_threads, config,
                                         member.generator)
        # The sequential baseline writes plain text: nothing to constrain.
        return choose_tokens(logits, config.sampling, member.generator).tolist()

    def _send_text(self, member: _Member) -> None:
        final = member.interpreter.final_text()
        if len(final) > len(member.emitted) and final.startswith(member.emitted):
            member.request.emit(TextDelta(final[len(member.emitted) :]))
            member.emitted = final

    def _end(self, group: _Group, ended: list[tuple[_Member, Finished | Failed | None]]) -> None:
        """Take these members out of the group (their cache rows freed), retire them and send their last event
        (None: cancelled, nobody listens)."""
        if not ended:
            return
        group.remove([m for m, _ in ended])
        for member, event in ended:
            request = member.request
            self.scheduler.retire(request)
            if isinstance(event, Finished):
                stats = event.result.stats
                self.metrics.sequences.labels("finished").inc()
                self.metrics.prompt_tokens.inc(len(request.prompt_ids))
                self.metrics.generation_tokens.inc(stats.num_tokens)
                self.metrics.theoretical_speedup.observe(stats.theoretical_speedup)
                self.metrics.sequence_seconds.observe(time.perf_counter() - request.arrived_s)
            else:
                self.metrics.sequences.labels("failed" if event else "cancelled").inc()
            if event is not None:
                if isinstance(event, Failed):
                    log.warning("request %d failed: %s", request.request_id, event.reason)
                request.emit(event)
        self._wake.set()  # retiring may have started waiting requests

    def _abandon(self, members: list[_Member], reason: str) -> None:
        """Fail these members without touching their batch (it may be what broke)."""
        for member in members:
            self.scheduler.retire(member.request)
            self.metrics.sequences.labels("failed").inc()
            member.request.emit(Failed(reason))


class _Group:
    """A StepBatch and the state of its members, in the same order."""

    def __init__(self, model, pad_id: int):
        self.batch = StepBatch(model, pad_id)
        self.members: list[_Member] = []

    def join(self, member: _Member, capacity: int) -> None:
        self.batch.join(member.interpreter, capacity)
        self.members.append(member)

    def remove(self, leaving: list[_Member]) -> None:
        gone = {id(m) for m in leaving}
        order = self.batch.remove([b for b, m in enumerate(self.members) if id(m) in gone])
        self.members = [self.members[b] for b in order]


def _num_running_chunks(interpreter: Interpreter | PlainInterpreter) -> int:
    return sum(1 for c in interpreter.chunks if c.state in (ChunkState.OPENING, ChunkState.RUNNING))


def _generator(config: DecodeConfig, device) -> torch.Generator | None:
    generators = request_generators(config.sampling, 1, device)
    return generators[0] if generators else None
