"""The PASTA-LANG interpreter of one request: thread state machines over token ids, no model.

Each step the runner asks every request for a `StepPlan` (the tokens to feed, their positions, the visibility-table
row each one attends with, and which rows' logits choose a next token), runs one forward for the whole batch, and
hands the chosen tokens back to `commit`. The rules are the ones `pasta.lang.build_layout` and `pasta.lang.schedule`
write down; the decoder follows them step by step:

- the prefill feeds the prompt and samples the main thread's first token;
- a main token sampled at step s is fed at step s + 1; a valid `<|promise|> topic <|promise_tokens|> N
  <|promise_end|>` forks a chunk when its `<|promise_end|>` is fed: the chunk's forced opener `<|async|> topic
  <|async_body|>` rides in the same forward at positions promise_end + 1 ..., and the main thread's next position
  skips `policy.span(len(opener), N)`;
- a chunk's sampled token is fed at the next step until it samples `<|async_end|>`; that last token waits;
- a `<|sync|>` sampled at step t is fed once every chunk of its group is closed, in the forward after the last one
  (max(t, last chunk step) + 1), together with the waiting `<|async_end|>` tokens of the group; the main thread
  then sees every chunk of the group;
- eos ends the main thread (the implicit join feeds nothing); the request is done when every thread is.

Visibility is a bool table per request, one row per thread over cache slots, kept incrementally: a fed token sets
its own slot in its thread's row; a fork copies the main row (promise_end included) into the chunk's row; a sync
ORs the joined chunks' rows into the main row. A fed token at step-offset i sees its row's slots up to
`start_slot + i`: that cut gives the causal order among the tokens fed in one step (a chunk's opener rows, the
waiting `<|async_end|>` rows before their `<|sync|>`). Row 0 is for padding: it sees slot 0 only.

Robustness: malformed output never raises. A promise that does not complete (eos, another tag, a bad topic or
count, a duplicated topic) falls back to literal text: its topic and count tokens stay in the plain text, its tag
tokens are stripped. Stray tags in the main thread or in a chunk are stripped. eos in a chunk closes it; a chunk
reaching `max_chunk_tokens` is force-closed; an empty chunk is dropped. Each event is counted in `malformed`.
The model's raw tokens stay in the cache as sampled; `token_doc()` is the cleaned structure (a valid TokenDoc).
With `decode.constrain`, the sampler asks `constraint(thread, grammar)` for the tokens that keep a thread
well-formed (pasta/decoding/grammar.py) and counts each choice it had to replace in `masked`.
Promises beyond `max_threads` running chunks wait in a queue and start when a running chunk closes (positions
and visibility are those of their promise, so only the timing changes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pasta.decoding.config import DecodeConfig
from pasta.decoding.grammar import MAX_COUNT_TOKENS, Constraint, Grammar
from pasta.decoding.render import Renderer
from pasta.decoding.text import find_stop
from pasta.decoding.threads import (
    Chunk,
    ChunkState,
    MainItem,
    MainState,
    PromiseItem,
    PromiseMode,
    SyncItem,
    TextRun,
)
from pasta.lang import (
    MAIN_THREAD,
    Document,
    ReservationPolicy,
    TagIds,
    TokenDoc,
)
from pasta.lang.syntax import MAX_TOPIC_CHARS, serialize, validate_topic

PAD_ROW = 0
MAIN_ROW = 1


@dataclass
class StepPlan:
    """What one request feeds into the next forward (parallel lists over its fed tokens)."""

    start_slot: int  # cache slot of the first fed token; the others follow
    token_ids: list[int]
    positions: list[int]
    rows: list[int]  # visibility-table row each token attends with
    threads: list[int]  # the thread each token belongs to: MAIN_THREAD (prompt too), or chunk index + 1
    sample_feeds: list[int]  # index of each fed token whose logits choose a next token
    sample_threads: list[int]  # the thread each of those tokens goes to: MAIN_THREAD, or chunk index + 1


class Interpreter:
    """One request: its threads, its visibility table and the text they write."""

    def __init__(
        self,
        prompt_ids: list[int],
        *,
        tag_ids: TagIds,
        eos_ids: set[int],
        policy: ReservationPolicy,
        config: DecodeConfig,
        decode: Callable[[list[int]], str],
        capacity: int,
        device: torch.device | str = "cpu",
    ):
        if not prompt_ids:
            raise ValueError("empty prompt")
        self.prompt_ids = list(prompt_ids)
        self.tag_ids = tag_ids
        self.eos_ids = set(eos_ids)
        self.policy = policy
        self.config = config
        self.decode = decode
        self.renderer = Renderer(decode, tag_ids)
        self.vis = torch.zeros(2 + config.max_threads, capacity, dtype=torch.bool, device=device)  # [R, C]
        self.vis[PAD_ROW, 0] = True
        self._free_rows = list(range(self.vis.shape[0] - 1, MAIN_ROW, -1))

        self.num_slots = 0  # cache slots used
        self.num_steps = 0
        self.num_sampled = 0  # by all threads
        self.malformed: Counter[str] = Counter()
        self.masked: Counter[str] = Counter()  # constrained choices replaced, by the malformed event they would cause
        self.finish_reason: str | None = None

        self.main_ids: list[int] = []  # everything the main thread sampled, as sampled
        self.main_state = MainState.RUNNING
        self.main_pending: int | None = None
        self.main_position = len(prompt_ids)
        self.prefilled = False
        self.items: list[MainItem] = []
        self.chunks: list[Chunk] = []
        self._mode = PromiseMode.TEXT  # where the main thread is inside a promise tag
        self._topic_ids: list[int] = []
        self._count_ids: list[int] = []
        self._group_topics: set[str] = set()
        self._stop_checked_len = 0
        self._max_stop_len = max((len(s) for s in config.stop_strings), default=0)

    # --- state -----------------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return (
            self.main_state == MainState.DONE
            and self.main_pending is None
            and all(c.state in (ChunkState.CLOSED, ChunkState.DROPPED) for c in self.chunks)
        )

    @property
    def num_threads(self) -> int:
        """Chunk threads that started."""
        return sum(1 for c in self.chunks if c.state in (ChunkState.OPENING, ChunkState.RUNNING, ChunkState.CLOSED))

    @property
    def num_overruns(self) -> int:
        return sum(1 for c in self.chunks if c.num_positions > c.num_reserved + 1)

    def ensure_capacity(self, capacity: int) -> None:
        if capacity > self.vis.shape[1]:
            grown = self.vis.new_zeros(self.vis.shape[0], capacity)
            grown[:, : self.vis.shape[1]] = self.vis
            self.vis = grown

    def _alloc_row(self) -> int:
        if not self._free_rows:
            old = self.vis.shape[0]
            self.vis = torch.cat([self.vis, self.vis.new_zeros(old, self.vis.shape[1])])
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        return self._free_rows.pop()

    def constraint(self, thread: int, grammar: Grammar) -> Constraint:
        """The tokens `thread` may choose next without writing malformed PASTA-LANG."""
        if thread != MAIN_THREAD:
            chunk = self.chunks[thread - 1]
            return grammar.chunk(chunk.has_text, self.config.max_chunk_tokens - chunk.num_sampled)
        budget = self.config.max_new_tokens - len(self.main_ids)
        if self._mode == PromiseMode.TOPIC:
            return grammar.topic(self._topic_ids, self.decode(self._topic_ids), self._group_topics, budget)
        if self._mode == PromiseMode.COUNT:
            return grammar.count(self._count_ids, self.decode(self._count_ids), budget)
        return grammar.main_text(budget)

    # --- planning a step ---------------------------------------------------------------------------------------

    def plan(self) -> StepPlan:
        """The tokens this request feeds into the next forward; sets their slots in the visibility table."""
        self.num_steps += 1
        plan = StepPlan(self.num_slots, [], [], [], [], [], [])
        if not self.prefilled:
            self.prefilled = True
            for position, token_id in enumerate(self.prompt_ids):
                self._feed(plan, token_id, position, MAIN_ROW, MAIN_THREAD)
            self._sample(plan, MAIN_THREAD)
            return plan

        if self.main_state == MainState.WAITING and all(c.state == ChunkState.CLOSED for c in self._group()):
            self._feed_join(plan)
        elif self.main_state != MainState.WAITING and self.main_pending is not None:
            token_id = self.main_pending
            self.main_pending = None
            self._feed(plan, token_id, self.main_position, MAIN_ROW, MAIN_THREAD)
            self.main_position += 1
            if self.main_state == MainState.RUNNING:
                self._sample(plan, MAIN_THREAD)
            forking = [c for c in self.chunks if c.state == ChunkState.FORKING]
            if forking:
                self._fork(forking[0])

        running = sum(1 for c in self.chunks if c.state in (ChunkState.OPENING, ChunkState.RUNNING))
        for chunk in self.chunks:
            if chunk.state == ChunkState.QUEUED and running < self.config.max_threads:
                chunk.state = ChunkState.OPENING
                running += 1
        for chunk in self.chunks:
            if chunk.state == ChunkState.OPENING:
                for token_id in chunk.opener_ids:
                    self._feed(plan, token_id, chunk.position, chunk.row, chunk.index + 1)
                    chunk.position += 1
                chunk.state = ChunkState.RUNNING
                self._sample(plan, chunk.index + 1)
            elif chunk.state == ChunkState.RUNNING and chunk.pending:
                self._feed_pending(plan, chunk)
                self._sample(plan, chunk.index + 1)
        return plan

    def _feed_pending(self, plan: StepPlan, chunk: Chunk) -> None:
        for token_id in chunk.pending:
            self._feed(plan, token_id, chunk.position, chunk.row, chunk.index + 1)
            chunk.position += 1
        chunk.pending = []

    def _feed(self, plan: StepPlan, token_id: int, position: int, row: int, thread: int) -> None:
        slot = self.num_slots
        self.num_slots += 1
        if slot >= self.vis.shape[1]:
            self.ensure_capacity(2 * self.vis.shape[1])
        self.vis[row, slot] = True
        plan.token_ids.append(token_id)
        plan.positions.append(position)
        plan.rows.append(row)
        plan.threads.append(thread)

    @staticmethod
    def _sample(plan: StepPlan, thread: int) -> None:
        plan.sample_feeds.append(len(plan.token_ids) - 1)
        plan.sample_threads.append(thread)

    def _fork(self, chunk: Chunk) -> None:
        """The promise_end was just fed: the chunk sees what it saw, and starts right after it."""
        chunk.row = self._alloc_row()
        self.vis[chunk.row] = self.vis[MAIN_ROW]
        chunk.position = self.main_position
        chunk.num_reserved = self.policy.num_reserved(chunk.num_predicted)
        self.main_position += self.policy.span(len(chunk.opener_ids), chunk.num_predicted)
        chunk.state = ChunkState.QUEUED

    def _group(self) -> list[Chunk]:
        """Chunks forked since the last join."""
        return [c for c in self.chunks if not c.joined and c.state != ChunkState.DROPPED]

    def _feed_join(self, plan: StepPlan) -> None:
        """The sync step: the group's closing tokens, then the sync, which sees every chunk of the group."""
        group = self._group()
        for chunk in group:
            self._feed_pending(plan, chunk)
        for chunk in group:
            self.vis[MAIN_ROW] |= self.vis[chunk.row]
            self._free_rows.append(chunk.row)  # kept as is for this step's mask; a fork overwrites it
            chunk.joined = True
        self._feed(plan, self.tag_ids.sync, self.main_position, MAIN_ROW, MAIN_THREAD)
        self.main_position += 1
        self.main_pending = None
        self.main_state = MainState.RUNNING
        self._group_topics.clear()
        self._sample(plan, MAIN_THREAD)

    # --- committing sampled tokens -------------------------------------------------------------------------------

    def commit(self, plan: StepPlan, token_ids: list[int]) -> None:
        """Take the tokens chosen at `plan.sample_feeds`, in order."""
        cap = self.config.max_total_tokens
        for thread, token_id in zip(plan.sample_threads, token_ids, strict=True):
            if cap is not None and self.num_sampled >= cap:
                break  # the rest of this step's tokens are over the budget
            self.num_sampled += 1
            if thread == MAIN_THREAD:
                self._commit_main(token_id)
            else:
                self._commit_chunk(self.chunks[thread - 1], token_id)
        if cap is not None and self.num_sampled >= cap:
            self._stop_all()

    def _commit_main(self, token_id: int) -> None:
        self.main_ids.append(token_id)
        if token_id in self.eos_ids:
            if self._mode != PromiseMode.TEXT:
                self._fall_back("unclosed_promise")
            self._finish_main("eos")
            return
        self.main_pending = token_id
        self._parse_main(token_id)
        if self.main_state != MainState.DONE and len(self.main_ids) >= self.config.max_new_tokens:
            if self._mode != PromiseMode.TEXT:
                self._fall_back("unclosed_promise")
            self._finish_main("max_new_tokens")

    def _parse_main(self, token_id: int) -> None:
        tags = self.tag_ids
        if self._mode == PromiseMode.TOPIC:
            if token_id == tags.promise_tokens:
                if validate_topic(self.decode(self._topic_ids)):
                    self._fall_back("bad_topic")
                else:
                    self._mode = PromiseMode.COUNT
                return
            if token_id == tags.promise_end:
                self._fall_back("bad_count")
                return
            if token_id not in tags.all:
                self._topic_ids.append(token_id)
                if len(self._topic_ids) > MAX_TOPIC_CHARS:
                    self._fall_back("bad_topic")
                return
            self._fall_back("unclosed_promise")  # another tag: the promise never closes; read the tag as text
        elif self._mode == PromiseMode.COUNT:
            if token_id == tags.promise_end:
                self._close_promise()
                return
            if token_id not in tags.all:
                self._count_ids.append(token_id)
                if len(self._count_ids) > MAX_COUNT_TOKENS:
                    self._fall_back("bad_count")
                return
            self._fall_back("unclosed_promise")

        if token_id == tags.promise:
            self._mode = PromiseMode.TOPIC
            self._topic_ids, self._count_ids = [], []
        elif token_id == tags.sync:
            self.items.append(SyncItem())
            self.main_state = MainState.WAITING
        elif token_id in (tags.async_start, tags.async_body, tags.async_end):
            self.malformed["async_tag_in_main"] += 1
        elif token_id in (tags.promise_tokens, tags.promise_end):
            self.malformed["stray_promise_tag"] += 1
        else:
            self._add_text(token_id)

    def _close_promise(self) -> None:
        raw = self.decode(self._count_ids).strip()
        topic = self.decode(self._topic_ids)
        if not (raw.isascii() and raw.isdigit() and int(raw) > 0):
            self._fall_back("bad_count")
            return
        if topic in self._group_topics:
            self._fall_back("duplicate_topic")
            return
        num_predicted = int(raw)
        self._group_topics.add(topic)
        self._mode = PromiseMode.TEXT
        tags = self.tag_ids
        chunk = Chunk(
            index=len(self.chunks),
            topic_ids=self._topic_ids,
            num_predicted=num_predicted,
            opener_ids=[tags.async_start, *self._topic_ids, tags.async_body],
        )
        self.chunks.append(chunk)
        self.items.append(PromiseItem(chunk, self._count_ids))

    def _fall_back(self, reason: str) -> None:
        """The promise being written is not valid: its topic and count tokens are plain text, its tags dropped."""
        self.malformed[reason] += 1
        self._mode = PromiseMode.TEXT
        for token_id in self._topic_ids + self._count_ids:
            self._add_text(token_id)
        self._topic_ids, self._count_ids = [], []

    def _add_text(self, token_id: int) -> None:
        if not self.items or not isinstance(self.items[-1], TextRun):
            self.items.append(TextRun())
            self._stop_checked_len = 0
        run = self.items[-1]
        run.ids.append(token_id)
        if self.config.stop_strings and self.main_state != MainState.DONE:
            text = self.decode(run.ids)
            stop_at = find_stop(text, self.config.stop_strings, self._stop_checked_len)
            self._stop_checked_len = len(text)
            if stop_at is not None:
                run.stop_at = stop_at
                self._finish_main("stop_string")

    def _finish_main(self, reason: str) -> None:
        self.main_state = MainState.DONE
        self.finish_reason = self.finish_reason or reason
        # A promise_end sampled as the last main token is still fed, so that its chunk forks.
        if not any(c.state == ChunkState.FORKING for c in self.chunks):
            self.main_pending = None

    def _commit_chunk(self, chunk: Chunk, token_id: int) -> None:
        chunk.num_sampled += 1
        chunk.num_positions += 1
        tags = self.tag_ids
        if token_id == tags.async_end:
            self._close_chunk(chunk, token_id)
            return
        if token_id in self.eos_ids:
            self.malformed["eos_in_chunk"] += 1
            self._close_chunk(chunk, tags.async_end)
            return
        if token_id in tags.all:
            self.malformed["tag_in_chunk"] += 1
        else:
            chunk.body_ids.append(token_id)
            chunk.has_text = chunk.has_text or bool(self.decode(chunk.body_ids).strip())
        chunk.pending = [token_id]
        if chunk.num_sampled >= self.config.max_chunk_tokens:
            self.malformed["chunk_cap"] += 1
            chunk.num_positions += 1
            self._close_chunk(chunk, tags.async_end)

    def _close_chunk(self, chunk: Chunk, closing_id: int) -> None:
        """The chunk is complete; its last tokens wait for the join (a sync), which feeds them."""
        chunk.body_ids.append(closing_id)
        chunk.pending = [*chunk.pending, closing_id]
        chunk.state = ChunkState.CLOSED
        if not self.decode(chunk.body_ids[:-1]).strip():
            self.malformed["empty_chunk"] += 1

    def _stop_all(self) -> None:
        """max_total_tokens: every thread stops; running chunks are closed as they are, waiting ones dropped."""
        if self.main_state != MainState.DONE:
            if self._mode != PromiseMode.TEXT:
                self._fall_back("unclosed_promise")
            self.finish_reason = "max_total_tokens"
            self.main_state = MainState.DONE
        self.main_pending = None
        for chunk in self.chunks:
            if chunk.state in (ChunkState.FORKING, ChunkState.QUEUED):
                chunk.state = ChunkState.DROPPED
            elif chunk.state == ChunkState.RUNNING:
                chunk.body_ids.append(self.tag_ids.async_end)
                chunk.state = ChunkState.CLOSED
            chunk.pending = []

    # --- results (pasta.decoding.render) ---------------------------------------------------------------------

    def text(self) -> str:
        """The plain text: main-thread text with each chunk spliced in at its promise."""
        return self.renderer.text(self.items)

    def final_text(self) -> str:
        """The prefix of the plain text that later steps cannot change (for streaming)."""
        return self.text() if self.done else self.renderer.final_text(self.items, self._max_stop_len)

    def document(self) -> Document:
        return self.renderer.document(self.items)

    def annotated(self) -> str:
        """The response in the inline form (what each thread wrote, malformed parts cleaned away)."""
        return serialize(self.document())

    def token_doc(self) -> TokenDoc:
        """The cleaned structure as ids: a valid TokenDoc (stray tags and dropped promises left out)."""
        return self.renderer.token_doc(self.items, self.main_ids[-1] if self.finish_reason == "eos" else None)
