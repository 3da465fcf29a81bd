"""The engine: one thread that owns the model and decodes every request in one continuous batch.

Each turn of its loop is one turn of the decoder's engine loop (`pasta.decoding.runner.engine_step`, the loop offline
decoding turns too; vLLM v1's schedule, execute, update) with the server's admission: cancelled requests leave, the
requests the scheduler started join the running batch (a request and its chooser each, a cache row each), and the batch
takes one step (every member plans its rows, one packed forward for all of them, a newcomer's prompt riding beside the
others' decode rows, each member chooses its tokens with its own sampling settings and generator and commits them).
Then every member that stepped gets the text that became final, finished members get their answer, failed ones their
error, and both are retired (the step loop has freed their cache rows already; an empty batch frees the whole cache).
The thread sleeps while nothing runs. Only this thread touches the batch: what /health and the gauges report is a view
it publishes once a step, after admitting, and before it sleeps.

What the engine adds to a step is kept to what the step added: the text that became final is rendered incrementally
(`pasta.decoding.render.SettledText`), and a member's event goes out only when its text grew. The step's timing is the
loop's own record (`StepTiming`), the same one the library's DecodeStats sum.

A request whose own plan, sampling or commit raises fails alone, with the step loop's reason as its error body, and the
others go on; a step that raises (its forward) fails every running request, since they shared it, and the engine serves
on with an empty batch. A greedy answer does not depend on the company a request keeps: its rows see only its own cache
row, and a sampled one draws from the request's own generator in a fixed order (the same tokens as `decode_async` with
that seed).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

import torch

from pasta.decoding import DECODE_MODES, DecodeConfig
from pasta.decoding.cache import initial_capacity
from pasta.decoding.requests import DecodeRequest, new_request, request_result, sampling_chooser
from pasta.decoding.runner import Member, StepBatch, StepOutcome, engine_step
from pasta.decoding.sampling import request_generators
from pasta.decoding.text import pad_token_id
from pasta.decoding.threads import ChunkState
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy
from pasta.serving.metrics import ServingMetrics
from pasta.serving.requests import EngineRequest, Failed, Finished, TextDelta
from pasta.serving.scheduler import AdmissionLimits, Scheduler

log = logging.getLogger(__name__)

MODES = DECODE_MODES  # the server serves every decoder the library runs


@dataclass
class EngineState:
    """What the engine holds right now (/health, the metrics gauges, tests)."""

    num_running: int  # sequences in the batch
    num_waiting: int  # sequences queued for admission
    num_threads: int  # main threads plus running chunk threads
    num_tokens_in_flight: int  # admission tokens of the running sequences
    num_cache_rows: int  # batch rows of the KV cache
    kv_cache_bytes: int


@dataclass(eq=False)
class _Served:
    """What the engine keeps beside a running member: its API request and the text sent so far."""

    request: EngineRequest
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
        self._batch = StepBatch(model, pad_token_id(tokenizer), multirow=cpu_multirow_linears)  # the continuous batch
        self._served: dict[int, _Served] = {}  # id(member) -> its API side
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # The batch as the engine thread last left it, replaced whole by that thread; the API's thread reads this,
        # never the batch (a read in the middle of a step could find a cache layer half released).
        self._view = EngineState(0, 0, 0, 0, 0, 0)
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
        """The published batch, with the scheduler's counters as they are now (they take its lock)."""
        return replace(self._view, num_waiting=self.scheduler.num_waiting,
                       num_tokens_in_flight=self.scheduler.num_tokens_in_flight)

    # --- the engine thread -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        batch = self._batch
        with torch.inference_mode(), batch:
            while not self._stopping:
                self._wake.clear()
                try:
                    outcome = engine_step(batch, self._admit)
                    if outcome is not None:
                        self._update(outcome)
                except Exception as exc:  # the forward, which every member shared, or a bug outside any one request
                    log.exception("engine step failed")
                    # Every request served: the batch's members, and those the step took out before what raised.
                    self._abandon(f"engine step failed: {exc}")
                    batch.clear()
                if not batch.members:
                    self._publish()
                    self._wake.wait()  # set by `submit`, `cancel`, `stop` and by retiring (it may start waiters)
            for request in self.scheduler.take_started():
                request.emit(Failed("the server is shutting down"))
            self._end([(m, Failed("the server is shutting down")) for m in batch.members])
        self._publish()

    def _publish(self) -> None:
        members, cache = self._batch.members, self._batch.cache
        self._view = EngineState(  # the scheduler's two counters are read live by `state`, not published
            num_running=len(members),
            num_waiting=0,
            num_threads=sum(1 + _num_running_chunks(m.request) for m in members),
            num_tokens_in_flight=0,
            num_cache_rows=0 if cache is None else cache.num_rows,
            kv_cache_bytes=0 if cache is None else cache.num_bytes(),
        )

    def _admit(self) -> None:
        """The engine loop's admission: cancelled members leave, and the requests the scheduler started join the
        running batch (their prompts' prefill rides in the next step's forward, packed beside the running requests'
        decode rows, no padding to the prompts' length); then the batch is published."""
        self._end([(m, None) for m in self._batch.members if self._served[id(m)].request.cancelled])
        for request in self.scheduler.take_started():
            if request.cancelled:
                self.scheduler.retire(request)
                self._wake.set()  # as below
                self.metrics.sequences.labels("cancelled").inc()
                continue
            config = request.config
            try:
                decoded = new_request(self.mode, self.model, self.tokenizer, request.prompt_ids, config, self.policy)
                choose = sampling_chooser(decoded, self.tokenizer, config, _generator(config, self.model.device))
                capacity = initial_capacity(len(request.prompt_ids), config.max_new_tokens)
                member = self._batch.join(decoded, choose, capacity)  # grows the cache: may run out of memory
            except Exception as exc:
                self.scheduler.retire(request)
                self._wake.set()  # retiring may have started waiting requests
                self.metrics.sequences.labels("failed").inc()
                request.emit(Failed(f"could not start the request: {exc}"))
                continue
            self._served[id(member)] = _Served(request)
        self._publish()  # once a step: what the last step and these joins and leaves left

    def _update(self, outcome: StepOutcome) -> None:
        """After a step: its members' text, answers and errors go out, and ended ones are retired."""
        self._observe(outcome)
        for member in outcome.stepped:
            self._send_text(member)
        ended: list[tuple[Member, Finished | Failed | None]] = [(f.member, Failed(f.reason)) for f in outcome.failed]
        ended += [(m, Finished(request_result(m.request, m.clock)))
                  for m in outcome.finished]
        self._end(ended, left=True)

    def _observe(self, outcome: StepOutcome) -> None:
        timing = outcome.timing
        if not timing.num_requests:
            return  # every member failed its planning: no forward ran
        self.metrics.forward_steps.inc()
        self.metrics.step_rows.observe(timing.num_rows)
        self.metrics.step_requests.observe(timing.num_requests)
        self.metrics.step_slots.inc(timing.num_slots)
        self.metrics.step_seconds.observe(timing.step_s)
        self.metrics.step_host_seconds.observe(timing.host_s)

    def _send_text(self, member: Member) -> None:
        served = self._served[id(member)]
        final = member.request.final_text()
        if len(final) > len(served.emitted) and final.startswith(served.emitted):
            served.request.emit(TextDelta(final[len(served.emitted) :]))
            served.emitted = final

    def _end(self, ended: list[tuple[Member, Finished | Failed | None]], *, left: bool = False) -> None:
        """Retire these members and send their last event (None: cancelled, nobody listens); `left`: they have
        left the batch already (the step loop takes finished and failed members out itself)."""
        if not ended:
            return
        if not left:
            self._batch.leave(m for m, _ in ended)
        for member, event in ended:
            request = self._served.pop(id(member)).request
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

    def _abandon(self, reason: str) -> None:
        """Fail every request served, without touching the batch (it may be what broke)."""
        for key in list(self._served):
            request = self._served.pop(key).request
            self.scheduler.retire(request)
            self.metrics.sequences.labels("failed").inc()
            request.emit(Failed(reason))
        self._wake.set()  # as in `_end`


def _num_running_chunks(request: DecodeRequest) -> int:
    return sum(1 for c in request.chunks if c.state in (ChunkState.OPENING, ChunkState.RUNNING))


def _generator(config: DecodeConfig, device) -> torch.Generator | None:
    generators = request_generators(config.sampling, 1, device)
    return generators[0] if generators else None
