"""Which tokens each thread of one request feeds into the next forward: the `StepPlan`; no model, no parsing.

The rules are the ones `pasta.lang.build_layout` and `pasta.lang.schedule` write down, followed step by step:

- the prefill feeds the prompt and samples the main thread's first token;
- a main token sampled at step s is fed at step s + 1; when the `<|promise_end|>` of a valid promise is fed, its
  chunk forks: the chunk's forced opener `<|async|> topic <|async_body|>` rides in the same forward at positions
  promise_end + 1 ..., and the main thread's next position skips `policy.span(len(opener), N)`;
- a chunk's sampled token is fed at the next step until it samples `<|async_end|>`; that last token waits;
- a `<|sync|>` sampled at step t is fed once every chunk of its group is closed, in the forward after the last one
  (max(t, last chunk step) + 1), together with the waiting `<|async_end|>` tokens of the group; the main thread
  then sees every chunk of the group;
- eos ends the main thread (the implicit join feeds nothing);
- with a draft (`decode.draft_skeleton`, pasta/decoding/draft.py), guessed main-thread tokens ride after the main
  thread's own token, each at the position it would take if chosen (past a drafted promise_end's chunk span), each
  sampling; at commit the ones the model chose stay (`settle_draft`), a kept promise_end forks its chunk as if it had
  been fed alone (`fork_drafted`), and the main thread no longer sees the others' slots.

Forked chunks beyond `max_threads` running ones wait (QUEUED) and start when a running chunk closes; their positions
and visibility are those of their promise, so only the timing changes. The scheduler reads and advances the
request's thread records (pasta.decoding.threads), which the interpreter updates from the sampled tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pasta.decoding.threads import Chunk, ChunkState, MainState, MainThread
from pasta.decoding.visibility import MAIN_ROW, VisibilityTable
from pasta.lang import MAIN_THREAD, ReservationPolicy


@dataclass
class StepPlan:
    """What one request feeds into the next forward (parallel lists over its fed tokens)."""

    start_slot: int  # cache slot of the first fed token; the others follow
    prefill: bool = False  # the request's first step: its prompt (a length of its own; never compiled)
    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # visibility-table row each token attends with
    threads: list[int] = field(default_factory=list)  # each token's thread: MAIN_THREAD (prompt too), or chunk + 1
    sample_feeds: list[int] = field(default_factory=list)  # index of each fed token whose logits choose a token
    sample_threads: list[int] = field(default_factory=list)  # the thread each of those tokens goes to
    draft_ids: list[int] = field(default_factory=list)  # tokens fed as a guess after the main thread's own
    # Every fed token sees every slot of its request up to its own (one thread, nothing hidden): plain causal
    # attention, which the packed step runs without a mask where it can (pasta/decoding/packing.py).
    causal: bool = False

    def feed(self, token_id: int, position: int, row: int, thread: int) -> None:
        """Feed a token at the next slot of the plan."""
        self.token_ids.append(token_id)
        self.positions.append(position)
        self.rows.append(row)
        self.threads.append(thread)

    def sample(self, thread: int) -> None:
        """The last fed token's logits choose `thread`'s next token."""
        self.sample_feeds.append(len(self.token_ids) - 1)
        self.sample_threads.append(thread)


@dataclass(frozen=True)
class DraftedToken:
    """A guessed main-thread token fed this step: where it went, and where the main thread goes on if it is kept."""

    token_id: int
    slot: int
    position: int
    next_position: int  # past its chunk's span when it is a promise_end


class Scheduler:
    """Plans one request's steps over its thread records; sets the fed tokens' slots in its visibility table."""

    def __init__(self, prompt_ids: list[int], main: MainThread, chunks: list[Chunk], visibility: VisibilityTable,
                 *, policy: ReservationPolicy, max_threads: int, sync_id: int, promise_end_id: int | None = None):
        self.prompt_ids = prompt_ids
        self.main = main
        self.chunks = chunks  # the interpreter appends each promised chunk (FORKING)
        self.visibility = visibility
        self.policy = policy
        self.max_threads = max_threads
        self.sync_id = sync_id
        self.promise_end_id = promise_end_id  # a drafted one skips its chunk's span (None: nothing is drafted)
        self.drafted: list[DraftedToken] = []  # this step's guessed main-thread tokens, until settle_draft

    def plan(self, draft_ids: Sequence[int] = (), num_opener_ids: int = 0) -> StepPlan:
        """The tokens of the next forward; `draft_ids` ride after the main thread's token when it feeds one (a
        drafted promise_end closes an uncounted promise whose chunk's opener holds `num_opener_ids` tokens)."""
        plan = StepPlan(self.visibility.num_slots, prefill=not self.main.prefilled)
        if plan.prefill:
            self.main.prefilled = True
            for position, token_id in enumerate(self.prompt_ids):
                self._feed(plan, token_id, position, MAIN_ROW, MAIN_THREAD)
            plan.sample(MAIN_THREAD)
        else:
            if self._feed_main(plan) and draft_ids:
                self._feed_draft(plan, draft_ids, num_opener_ids)
            self._start_queued()
            self._feed_chunks(plan)
        plan.causal = self.visibility.main_sees_all and all(row == MAIN_ROW for row in plan.rows)
        return plan

    def group(self) -> list[Chunk]:
        """Chunks forked since the last join."""
        return [c for c in self.chunks if not c.joined and c.state != ChunkState.DROPPED]

    def _feed(self, plan: StepPlan, token_id: int, position: int, row: int, thread: int) -> None:
        self.visibility.take_slot(row, position)
        plan.feed(token_id, position, row, thread)

    def _feed_main(self, plan: StepPlan) -> bool:
        """The main thread's pending token (forking a chunk after its promise_end), or the join it waits for.
        Whether it fed its pending token and samples after it (where a draft may follow)."""
        main = self.main
        if main.state == MainState.WAITING:
            if all(c.state == ChunkState.CLOSED for c in self.group()):
                self._feed_join(plan)
            return False
        if main.pending is None:
            return False
        self._feed(plan, main.pending, main.position, MAIN_ROW, MAIN_THREAD)
        main.pending = None
        main.position += 1
        if main.state == MainState.RUNNING:
            plan.sample(MAIN_THREAD)
        forking = [c for c in self.chunks if c.state == ChunkState.FORKING]
        if forking:
            self._fork(forking[0])
        return main.state == MainState.RUNNING

    def _feed_draft(self, plan: StepPlan, draft_ids: Sequence[int], num_opener_ids: int) -> None:
        """Guessed tokens after the main thread's own, each where it would go if chosen (past a promise_end's chunk
        span, as `_fork` skips it); each samples."""
        for token_id in draft_ids:
            slot, position = self.visibility.num_slots, self.main.position
            self._feed(plan, token_id, position, MAIN_ROW, MAIN_THREAD)
            plan.sample(MAIN_THREAD)
            plan.draft_ids.append(token_id)
            self.main.position += 1
            if token_id == self.promise_end_id:
                self.main.position += self.policy.span(num_opener_ids, None)
            self.drafted.append(DraftedToken(token_id, slot, position, self.main.position))

    def fork_drafted(self, chunk: Chunk, index: int) -> None:
        """The chunk of the kept promise_end drafted `index`-th this step: it sees what the main thread saw through
        that token, and starts right after it (`_fork`'s rule, for a promise_end the main thread fed as a guess)."""
        drafted = self.drafted[index]
        chunk.row = self.visibility.fork(through_slot=drafted.slot)
        chunk.position = drafted.position + 1
        chunk.num_reserved = self.policy.num_reserved(chunk.num_predicted)
        chunk.state = ChunkState.QUEUED

    def drafted_without_fork(self, index: int) -> None:
        """The promise_end drafted `index`-th this step was kept but closed no promise: the main thread goes on right
        after it."""
        self.drafted[index] = replace(self.drafted[index], next_position=self.drafted[index].position + 1)

    def settle_draft(self, num_kept: int) -> None:
        """The first `num_kept` drafted tokens were chosen: the main thread goes on after the last of them, and no
        longer sees the others (their slots stay used, unseen)."""
        if not self.drafted:
            return
        kept, dropped = self.drafted[:num_kept], self.drafted[num_kept:]
        self.main.position = kept[-1].next_position if kept else self.drafted[0].position
        if dropped:
            self.visibility.drop_main_slots([d.slot for d in dropped])
        self.drafted = []

    def _fork(self, chunk: Chunk) -> None:
        """The promise_end was just fed: the chunk sees what it saw, and starts right after it."""
        chunk.row = self.visibility.fork()
        chunk.position = self.main.position
        chunk.num_reserved = self.policy.num_reserved(chunk.num_predicted)
        self.main.position += self.policy.span(len(chunk.opener_ids), chunk.num_predicted)
        chunk.state = ChunkState.QUEUED

    def _feed_join(self, plan: StepPlan) -> None:
        """The sync step: the group's closing tokens, then the sync, which sees every chunk of the group."""
        group = self.group()
        for chunk in group:
            self._feed_pending(plan, chunk)
        for chunk in group:
            self.visibility.join(chunk.row)
            chunk.joined = True
        self._feed(plan, self.sync_id, self.main.position, MAIN_ROW, MAIN_THREAD)
        self.main.position += 1
        self.main.pending = None
        self.main.state = MainState.RUNNING
        plan.sample(MAIN_THREAD)

    def _start_queued(self) -> None:
        """Queued chunks start, in promise order, while fewer than `max_threads` run."""
        running = sum(1 for c in self.chunks if c.state in (ChunkState.OPENING, ChunkState.RUNNING))
        for chunk in self.chunks:
            if chunk.state == ChunkState.QUEUED and running < self.max_threads:
                chunk.state = ChunkState.OPENING
                running += 1

    def _feed_chunks(self, plan: StepPlan) -> None:
        """Each opening chunk's opener, each running chunk's pending token; each of them samples."""
        for chunk in self.chunks:
            if chunk.state == ChunkState.OPENING:
                for token_id in chunk.opener_ids:
                    self._feed(plan, token_id, chunk.position, chunk.row, chunk.index + 1)
                    chunk.position += 1
                chunk.state = ChunkState.RUNNING
                plan.sample(chunk.index + 1)
            elif chunk.state == ChunkState.RUNNING and chunk.pending:
                self._feed_pending(plan, chunk)
                plan.sample(chunk.index + 1)

    def _feed_pending(self, plan: StepPlan, chunk: Chunk) -> None:
        for token_id in chunk.pending:
            self._feed(plan, token_id, chunk.position, chunk.row, chunk.index + 1)
            chunk.position += 1
        chunk.pending = []
