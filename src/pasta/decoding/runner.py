"""The step loop: one step of a batch of requests, written once, through which every decode runs.

    with StepBatch(model, pad_id, StepForward(model)) as batch:
        batch.join(request, choose, capacity)      # between steps, any time: continuous batching
        while batch.members:
            outcome = batch.step()                 # plan -> pack -> forward -> choose -> commit
            outcome.timing, outcome.finished, outcome.failed

A step: every member's request plans what it feeds (`Interpreter.plan`, or `PlainInterpreter.plan` for the
sequential baseline); the plans are packed into one ragged block (pasta/decoding/packing.py: input_ids and
position_ids [1, N], N the rows the requests actually feed, each row written at its own request's next cache slot)
and the model runs once (pasta/decoding/step.py); each member's chooser picks its tokens from the logits of its
choosing rows (its own sampling settings and generator, the grammar's constraint, or teacher forcing), and its
request commits them. `StepTiming` records the phases (pasta/decoding/timing.py). Members whose request is done,
or whose step failed, leave the batch at once (their cache rows freed).

The engine loop is `engine_step` below, one turn of it (vLLM v1's schedule, execute, update): the caller's admission
joins whatever may start, between steps, then the batch steps. Offline and served decoding turn the same loop, each
with its own admission: `run_to_completion` (`decode_async` / `decode_sequential` and teacher forcing in
pasta/decoding/api.py, so evaluation, the preference stage's sampling and `pasta.generate`) admits from its queue
until it runs dry, at most `max_members` at once; the server's engine (pasta/serving/engine.py) admits what its
scheduler started and drops cancelled requests, and turns the loop while anything runs; `stream_async` (a generator)
admits its one request on the first turn and yields between turns. The cost model's measurement
(pasta/decoding/step_costs.py) and both benchmarks step a batch directly.

A failure that belongs to one request (its plan, its choice, its commit raising) ends that request alone, with one
`Failure.reason` that every caller reports as it is: the server as the request's error body, a library call as its
DecodeError. A forward that raises belongs to every request in it: `step` raises it to the caller.

While the batch is open (`with`) the model attends with the ragged attention (pasta/decoding/attention.py), and
steps that feed no prompt run the CPU multi-row linears (pasta/decoding/linears.py); a step that feeds a prompt runs
transformers' own, so the prompt's cache is `generate`'s.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Protocol

import torch

from pasta.decoding.attention import attention_window, ragged_attention
from pasta.decoding.cache import SlotCache
from pasta.decoding.linears import MultirowLinears
from pasta.decoding.packing import PackedStep, bucket_slots, pack_step
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward
from pasta.decoding.timing import RequestClock, StepTiming
from pasta.errors import PastaError

# (logits [n, V] of the plan's choosing rows, the plan) -> the n chosen token ids, in `plan.sample_threads` order
# (None for a row that chooses nothing: a drafted main-thread row, pasta/decoding/requests.py's choose_with_draft)
Chooser = Callable[[torch.Tensor, StepPlan], list[int | None]]


class Request(Protocol):
    """What the loop asks of a request: pasta/decoding/interpreter.py's Interpreter, or plain.py's PlainInterpreter."""

    prompt_ids: list[int]

    @property
    def done(self) -> bool: ...

    @property
    def vis(self) -> torch.Tensor: ...

    def slot_positions(self) -> torch.Tensor: ...

    def ensure_capacity(self, capacity: int) -> None: ...

    def plan(self) -> StepPlan: ...

    def commit(self, plan: StepPlan, token_ids: list[int | None]) -> None: ...


@dataclass(eq=False)
class Member:
    """A request in the batch, the chooser of its tokens, and its share of the steps' time."""

    request: Request
    choose: Chooser
    clock: RequestClock = field(default_factory=RequestClock)


@dataclass(frozen=True)
class Failure:
    """A member whose own part of a step raised; `reason` is what every caller reports."""

    member: Member
    reason: str
    error: BaseException


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: its timing, the members that took part and are fine (finished ones included), the
    members that finished, and those that failed. Finished and failed members have left the batch."""

    timing: StepTiming
    stepped: list[Member]
    finished: list[Member]
    failed: list[Failure]


class DecodeError(PastaError):
    """A library decode in which some requests failed, raised once the others are done: the failures, where the
    failed requests stood in the call (`failed_indices`), every request's member in call order (`members`: the
    failed ones' included) and, from pasta.decoding.api, every request's DecodeResult (`results`: None for a
    failed one). Its message is the first failure's reason."""

    def __init__(self, failures: list[Failure], members: list[Member]):
        self.failures, self.members = failures, members
        self.failed_indices = [next(i for i, m in enumerate(members) if m is f.member) for f in failures]
        self.results: list | None = None
        super().__init__(failures[0].reason)


class StepBatch:
    """Requests decoded together: one SlotCache (a cache row per request), one packed forward per step."""

    def __init__(self, model, pad_id: int, forward: StepForward | None = None, *, multirow: bool = True):
        self.model = model
        self.pad_id = pad_id
        self.forward = forward or StepForward(model)
        self.device = model.device
        self.dtype = model.dtype if model.dtype.is_floating_point else torch.float32
        self.window = attention_window(model)  # the sliding window packing applies (None: no layer slides)
        self.multirow = multirow
        self.members: list[Member] = []
        self.cache: SlotCache | None = None
        self._open: ExitStack | None = None
        self._linears: MultirowLinears | None = None

    def __enter__(self) -> StepBatch:
        stack = ExitStack()
        stack.enter_context(ragged_attention(self.model))
        self._linears = stack.enter_context(MultirowLinears(self.model, self.multirow))
        self._open = stack
        return self

    def __exit__(self, *exc) -> None:
        self._open.close()
        self._open = self._linears = None

    # --- membership, between steps ------------------------------------------------------------------------------

    def join(self, request: Request, choose: Chooser, capacity: int) -> Member:
        """Add a request: its prompt's prefill rides in the next step's forward, beside the others' rows.
        `capacity` sizes the cache when this request starts it (it grows on demand anyway)."""
        if self.cache is None:
            self.cache = SlotCache.for_model(self.model, capacity, pool=self.forward.store_pool)
        else:
            self.cache.add_rows(1)
        member = Member(request, choose)
        self.members.append(member)
        return member

    def leave(self, members: Iterable[Member]) -> None:
        """These members leave (their cache rows freed); the last members move into the holes."""
        gone = {id(m) for m in members}
        indices = [b for b, m in enumerate(self.members) if id(m) in gone]
        if not indices:
            return
        order = self.cache.remove(indices)
        self.members = [self.members[b] for b in order]
        if not self.members:
            self._drop_cache()

    def clear(self) -> None:
        """Every member leaves and the cache is dropped (after a step that raised: the batch may be what broke)."""
        self.members = []
        self._drop_cache()

    def _drop_cache(self) -> None:
        if self.cache is not None:
            self.cache.release()
        self.cache = None

    # --- one step ------------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> StepOutcome:
        """Plan, pack, forward, choose, commit: one forward for every member. Raises what the forward raises."""
        if self._open is None:
            raise RuntimeError("StepBatch.step outside its `with` block: the model's attention is not installed")
        started = time.perf_counter()
        members, plans, failed = [], [], []
        for member in self.members:
            try:
                plans.append(member.request.plan())
                members.append(member)
            except Exception as exc:
                failed.append(Failure(member, f"planning the step failed: {exc}", exc))
        if failed:
            self.leave(f.member for f in failed)
            # The last members moved into the rows that left: the plans are packed in the members' new order,
            # since a plan's index is its cache row.
            plan_of = {id(m): p for m, p in zip(members, plans, strict=True)}
            members = list(self.members)
            plans = [plan_of[id(m)] for m in members]
        if not members:
            return StepOutcome(StepTiming(time.perf_counter() - started, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, False),
                               [], [], failed)
        planned = time.perf_counter()

        packed = self._pack(plans)
        packed_at = time.perf_counter()

        self._linears.use(not packed.prefill)
        logits = self.forward(self.cache, packed)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        forwarded = time.perf_counter()

        chosen: list[list[int] | None] = []
        offset = 0
        for member, plan in zip(members, plans, strict=True):
            rows = logits[offset : offset + len(plan.sample_feeds)]  # [n, V]
            offset += len(plan.sample_feeds)
            try:
                chosen.append(member.choose(rows, plan))
            except Exception as exc:
                chosen.append(None)
                failed.append(Failure(member, f"sampling or committing the step failed: {exc}", exc))
        chose = time.perf_counter()

        for member, plan, token_ids in zip(members, plans, chosen, strict=True):
            if token_ids is None:
                continue
            try:
                member.request.commit(plan, token_ids)
            except Exception as exc:
                failed.append(Failure(member, f"sampling or committing the step failed: {exc}", exc))
        committed = time.perf_counter()

        timing = StepTiming(plan_s=planned - started, pack_s=packed_at - planned, forward_s=forwarded - packed_at,
                            choose_s=chose - forwarded, commit_s=committed - chose, num_rows=packed.num_rows,
                            num_requests=len(members), num_slots=packed.num_slots, prefill=packed.prefill)
        broken = {id(f.member) for f in failed}
        stepped = []
        for member, plan in zip(members, plans, strict=True):
            member.clock.add(timing, prefill=plan.prefill)
            if id(member) not in broken:
                stepped.append(member)
        finished = [m for m in stepped if m.request.done]
        self.leave([*finished, *(f.member for f in failed)])
        return StepOutcome(timing, stepped, finished, failed)

    def _pack(self, plans: list[StepPlan]) -> PackedStep:
        """The members' plans packed (pasta/decoding/packing.py), each row placed at its request's next cache slot.
        A compiled step that feeds no prompt takes packing.py's buckets; every other step its exact sizes."""
        bucketed = self.forward.compiled and not any(p.prefill for p in plans)
        used = max(p.start_slot + len(p.token_ids) for p in plans)
        self.cache.reserve(bucket_slots(used) if bucketed else used)
        for member in self.members:
            member.request.ensure_capacity(self.cache.capacity)
        positions = None if self.window is None else [m.request.slot_positions() for m in self.members]
        packed = pack_step(plans, [m.request.vis for m in self.members], self.pad_id, capacity=self.cache.capacity,
                           bucketed=bucketed, dtype=self.dtype, device=self.device, window=self.window,
                           slot_positions=positions)
        self.cache.place(packed.row_ids, packed.slot_ids, packed.kv_length, packed.seq_length)
        return packed


def engine_step(batch: StepBatch, admit: Callable[[], None]) -> StepOutcome | None:
    """One turn of the engine loop, offline and served alike: `admit` joins whatever may start now (the caller's
    admission), between steps; then the batch takes one step, after which its finished and failed members have left.
    None when nothing runs after admitting. Raises what the step's forward raises (or what `admit` raises)."""
    # Joining between steps writes into the cache, whose stores a step may have made inference tensors.
    with torch.inference_mode():
        admit()
    if not batch.members:
        return None
    return batch.step()


def run_to_completion(batch: StepBatch, requests: list[tuple[Request, Chooser]], capacity: int,
                      on_step: Callable[[StepOutcome], None] | None = None, *, max_members: int | None = None,
                      on_finish: Callable[[int, Member], None] | None = None) -> list[Member]:
    """Step `requests` (each with its chooser) in the open `batch` until every one is done; their members, in the
    order given. At most `max_members` decode at once (None: all): as one finishes, the next one in line joins
    between steps (continuous batching), so the batch stays full until the queue runs dry. `on_step` sees each
    step's outcome (streaming); `on_finish(index, member)` sees each request that finishes well, as it finishes.
    A request that fails ends alone; once the others are done, the first failure's PastaError is raised as it is
    (a refusal of the caller's input, such as a response teacher forcing cannot replay), and any other failure as a
    DecodeError carrying its reason."""
    if max_members is not None and max_members < 1:
        raise ValueError(f"max_members={max_members} must be >= 1")
    waiting = deque(enumerate(requests))
    members: list[Member | None] = [None] * len(requests)
    index: dict[int, int] = {}

    def admit() -> None:
        while waiting and (max_members is None or len(batch.members) < max_members):
            i, (request, choose) = waiting.popleft()
            members[i] = batch.join(request, choose, capacity)
            index[id(members[i])] = i

    failures: list[Failure] = []
    while (outcome := engine_step(batch, admit)) is not None:
        failures += outcome.failed
        if on_step is not None:
            on_step(outcome)
        if on_finish is not None:
            for member in outcome.finished:
                on_finish(index[id(member)], member)
    if failures:
        first = failures[0].error
        if isinstance(first, PastaError):
            raise first
        raise DecodeError(failures, members)
    return members
