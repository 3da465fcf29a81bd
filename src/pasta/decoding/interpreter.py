"""The PASTA-LANG interpreter of one request: its threads' state over token ids, no model.

Each step the runner asks every request for a `StepPlan` (the tokens to feed, their positions, the visibility-table
row each one attends with, and which rows' logits choose a next token), runs one forward for the whole batch, and
hands the chosen tokens back to `commit`. The interpreter wires three parts, as vLLM v1 splits a request's state,
its KV bookkeeping and its scheduler:

- `parser.PromiseParser` reads the main thread's tokens into typed events (text, promises, syncs, fallbacks);
- `visibility.VisibilityTable` keeps which cache slots each thread sees, and the slots used;
- `scheduler.Scheduler` plans which tokens each thread feeds at the next step (fork, join and queue timing);

and keeps the rest: the main thread's items (text runs, promises, syncs), the chunks' content, the limits and the
malformed-event counts. eos ends the main thread; the request is done when every thread is.

Robustness: malformed output never raises. A promise that does not complete falls back to literal text (the
parser's rules). Stray tags in the main thread or in a chunk are stripped. eos in a chunk closes it; a chunk
reaching `max_chunk_tokens` is force-closed; an empty chunk is dropped. Each event is counted in `malformed`.
The model's raw tokens stay in the cache as sampled; `token_doc()` is the cleaned structure (a valid TokenDoc).
With `decode.constrain`, the sampler asks `constraint(thread, grammar)` for the tokens that keep a thread
well-formed (pasta/decoding/grammar.py) and counts each choice it had to replace in `masked`. With
`decode.draft_skeleton`, each plan carries a guess of the main thread's next tokens (pasta/decoding/draft.py);
the chooser keeps the ones the model chooses (`keep_drafted`), and `commit` settles the rest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from pasta.decoding.config import DecodeConfig
from pasta.decoding.draft import SkeletonDraft
from pasta.decoding.grammar import Constraint, Grammar
from pasta.decoding.parser import (
    FallBack,
    MainEvent,
    PromiseClosed,
    PromiseParser,
    StrayTag,
    SyncTag,
    TextToken,
)
from pasta.decoding.render import Renderer, SettledText
from pasta.decoding.scheduler import Scheduler, StepPlan
from pasta.decoding.text import find_stop
from pasta.decoding.threads import (
    Chunk,
    ChunkState,
    MainItem,
    MainState,
    MainThread,
    PromiseItem,
    PromiseMode,
    SyncItem,
    TextRun,
)
from pasta.decoding.visibility import VisibilityTable
from pasta.lang import (
    MAIN_THREAD,
    Document,
    ReservationPolicy,
    TagIds,
    TokenDoc,
)
from pasta.lang.syntax import serialize


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
        encode: Callable[[str], list[int]] | None = None,
    ):
        if not prompt_ids:
            raise ValueError("empty prompt")
        self.prompt_ids = list(prompt_ids)
        self.tag_ids = tag_ids
        self.eos_ids = set(eos_ids)
        self.config = config
        self.decode = decode
        self.renderer = Renderer(decode, tag_ids)
        self.parser = PromiseParser(tag_ids, decode)
        self.visibility = VisibilityTable(config.max_threads, capacity, device)
        self.main = MainThread(position=len(prompt_ids))
        self.chunks: list[Chunk] = []
        self.scheduler = Scheduler(self.prompt_ids, self.main, self.chunks, self.visibility, policy=policy,
                                   max_threads=config.max_threads, sync_id=tag_ids.sync,
                                   promise_end_id=tag_ids.promise_end)
        # A guess is kept when the sampler, choosing at the guess's row as it would at the guess's own step, picks
        # it: greedy, the same tokens; sampled, each token drawn from the distribution it has without the draft, so
        # the answer is distributed alike (its draws come from the generator in another order: another sample).
        drafting = config.draft_skeleton and encode is not None
        self.draft = SkeletonDraft(tag_ids, decode, encode) if drafting else None
        self._num_kept = 0  # drafted tokens kept this step
        self._draft_stale = False  # a kept guess moved the main thread where the later guesses were not fed

        self.num_steps = 0
        self.step_rows: list[int] = []  # rows fed at each step, the prompt's prefill first
        self.num_sampled = 0  # by all threads
        self.num_tag_tokens = 0  # sampled tags (a promise's tokens, syncs, chunk ends), by all threads
        self.num_main_tag_tokens = 0  # the main thread's
        self.malformed: Counter[str] = Counter()
        self.masked: Counter[str] = Counter()  # constrained choices replaced, by the malformed event they would cause
        self.num_forced = 0  # constrained choices with one legal token (what jump-forward would skip a step for)
        self.num_drafted = 0  # guessed main-thread tokens fed (decode.draft_skeleton)
        self.num_draft_kept = 0  # of them, the ones the model chose
        self.finish_reason: str | None = None
        self.topic_loop = False  # a topic extended an earlier one word by word: no more promises (stop_topic_loops)
        self.main_ids: list[int] = []  # everything the main thread sampled, as sampled
        self.items: list[MainItem] = []
        self._stop_checked_len = 0
        self._settled = SettledText(self.renderer, max((len(s) for s in config.stop_strings), default=0))

    # --- state -----------------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return (
            self.main.state == MainState.DONE
            and self.main.pending is None
            and all(c.state in (ChunkState.CLOSED, ChunkState.DROPPED) for c in self.chunks)
        )

    @property
    def num_threads(self) -> int:
        """Chunk threads that started."""
        return sum(1 for c in self.chunks if c.state in (ChunkState.OPENING, ChunkState.RUNNING, ChunkState.CLOSED))

    @property
    def num_overruns(self) -> int:
        return sum(1 for c in self.chunks if c.num_positions > c.num_reserved + 1)

    @property
    def vis(self) -> torch.Tensor:
        """The visibility table [R, C]: row r sees the cache slots set in it."""
        return self.visibility.rows

    def ensure_capacity(self, capacity: int) -> None:
        self.visibility.ensure_capacity(capacity)

    def slot_positions(self) -> torch.Tensor:
        """The position of each cache slot [C] (what a sliding window reads)."""
        return self.visibility.slot_positions()

    def constraint(self, thread: int, grammar: Grammar) -> Constraint:
        """The tokens `thread` may choose next without writing malformed PASTA-LANG."""
        if thread != MAIN_THREAD:
            chunk = self.chunks[thread - 1]
            return grammar.chunk(chunk.has_text, self.config.max_chunk_tokens - chunk.num_sampled)
        # The tags the main thread may still sample: under its own cap, or what all threads together have left
        # (chunks spend that budget too, so a promise opened on the last tokens could not close), and the free tags
        # on top. Every token of a promise is a tag, whether the free ones are spent or not.
        budget = min(self.config.max_new_tokens - len(self.main_ids),
                     self.config.total_token_budget - self.num_sampled) + self.config.free_tag_tokens
        parser = self.parser
        if parser.mode == PromiseMode.TOPIC:
            return grammar.topic(parser.topic_ids, self.decode(parser.topic_ids), parser.answer_topics, budget,
                                 self.config.max_topic_chars)
        if parser.mode == PromiseMode.COUNT:
            return grammar.count(parser.count_ids, self.decode(parser.count_ids), budget, self.config.max_chunk_tokens)
        capped = self.config.max_promises is not None and len(self.chunks) >= self.config.max_promises
        return grammar.main_text(budget, can_promise=not capped and not self.topic_loop)

    @property
    def main_samples(self) -> bool:
        """The main thread still chooses tokens (running, not waiting at a sync, not done)."""
        return self.main.state == MainState.RUNNING

    def plan(self) -> StepPlan:
        """The tokens this request feeds into the next forward; sets their slots in the visibility table."""
        self.num_steps += 1
        # A drafted promise_end closes the topic so far: its chunk's opener is <|async|> topic <|async_body|>.
        plan = self.scheduler.plan(self._draft(), num_opener_ids=2 + len(self.parser.topic_ids))
        self.num_drafted += len(plan.draft_ids)
        self._num_kept = 0
        self._draft_stale = False
        self.step_rows.append(len(plan.token_ids))
        return plan

    def _draft(self) -> list[int]:
        """The guess to feed after the main thread's pending token (none in a count: the draft knows uncounted
        promises only)."""
        if (self.draft is None or self.main.pending is None or not self.main_samples
                or self.parser.mode == PromiseMode.COUNT):
            return []
        return self.draft(self.main_ids, self.parser.mode == PromiseMode.TOPIC and bool(self.parser.topic_ids))

    def keep_drafted(self, token_id: int) -> bool:
        """The chooser chose the next guessed token of this step: commit it as a main-thread token already fed.
        False, and nothing done, where the step could not take it (the budget spent, the main thread done): the
        choice is then the main thread's next token, as without a draft."""
        if not self.main_samples or self._budget_spent() or self._draft_stale:
            return False
        index = self._num_kept
        self.num_sampled += 1
        self._commit_main(token_id)
        self.main.pending = None  # fed this step, as a guess
        forking = [c for c in self.chunks if c.state == ChunkState.FORKING]
        if forking:
            self.scheduler.fork_drafted(forking[0], index)
        elif token_id == self.tag_ids.promise_end:
            # A promise_end that closed no promise (unconstrained: a topic the parser refused) forks nothing: the
            # guesses after it were fed past a chunk span that is not there, so none of them can be kept.
            self.scheduler.drafted_without_fork(index)
            self._draft_stale = True
        self._num_kept += 1
        self.num_draft_kept += 1
        return True

    # --- committing sampled tokens -------------------------------------------------------------------------------

    def commit(self, plan: StepPlan, token_ids: list[int | None]) -> None:
        """Take the tokens chosen at `plan.sample_feeds`, in order (None: a drafted row whose token was kept, or one
        after the main thread's choice)."""
        self.scheduler.settle_draft(self._num_kept)
        for thread, token_id in zip(plan.sample_threads, token_ids, strict=True):
            if token_id is None:
                continue
            if self._budget_spent():
                break  # the rest of this step's tokens are over the budget
            self.num_sampled += 1
            if thread == MAIN_THREAD:
                self._commit_main(token_id)
            else:
                self._commit_chunk(self.chunks[thread - 1], token_id)
        if self._budget_spent():
            self._stop_all()

    def _budget_spent(self) -> bool:
        """All threads together have spent `max_total_tokens` (decode.free_tag_tokens of their tags aside)."""
        return self._spent(self.num_sampled, self.num_tag_tokens) >= self.config.total_token_budget

    def _spent(self, num_tokens: int, num_tags: int) -> int:
        """What `num_tokens` sampled tokens, `num_tags` of them tags, spend of a budget: decode.free_tag_tokens of
        the tags are free, so a budget counts an answer's text as a sequential answer's does."""
        return num_tokens - min(num_tags, self.config.free_tag_tokens)

    def _commit_main(self, token_id: int) -> None:
        self.main_ids.append(token_id)
        if token_id in self.tag_ids.all or self.parser.mode != PromiseMode.TEXT:  # a topic's or count's token too
            self.num_tag_tokens += 1
            self.num_main_tag_tokens += 1
        if token_id in self.eos_ids:
            self._apply(self.parser.abandon())
            self._finish_main("eos")
            return
        self.main.pending = token_id
        self._apply(self.parser.feed(token_id))
        if (self.main.state != MainState.DONE
                and self._spent(len(self.main_ids), self.num_main_tag_tokens) >= self.config.max_new_tokens):
            self._apply(self.parser.abandon())
            self._finish_main("max_new_tokens")

    def _apply(self, events: list[MainEvent]) -> None:
        """The parser's events, in order, onto the main thread's items and counts."""
        for event in events:
            if isinstance(event, TextToken):
                self._add_text(event.token_id)
            elif isinstance(event, FallBack):
                self.malformed[event.reason] += 1
                for token_id in event.text_ids:
                    self._add_text(token_id)
            elif isinstance(event, StrayTag):
                self.malformed[event.kind] += 1
            elif isinstance(event, SyncTag):
                self.items.append(SyncItem())
                self.main.state = MainState.WAITING
            elif isinstance(event, PromiseClosed):
                self._add_chunk(event)
            # PromiseOpened changes nothing here: the promise shows once it closes or falls back.

    def _add_chunk(self, promise: PromiseClosed) -> None:
        """A valid promise: its chunk forks when the promise_end is fed (pasta.decoding.scheduler)."""
        tags = self.tag_ids
        chunk = Chunk(
            index=len(self.chunks),
            topic_ids=promise.topic_ids,
            num_predicted=promise.num_predicted,
            opener_ids=[tags.async_start, *promise.topic_ids, tags.async_body],
        )
        if self.config.stop_topic_loops and not self.topic_loop:
            topic = self.decode(promise.topic_ids).strip()
            self.topic_loop = any(topic.startswith(self.decode(c.topic_ids).strip() + " ") for c in self.chunks)
        self.chunks.append(chunk)
        self.items.append(PromiseItem(chunk, promise.count_ids))

    def _add_text(self, token_id: int) -> None:
        if not self.items or not isinstance(self.items[-1], TextRun):
            self.items.append(TextRun())
            self._stop_checked_len = 0
        run = self.items[-1]
        run.ids.append(token_id)
        if self.config.stop_strings and self.main.state != MainState.DONE:
            text = self.decode(run.ids)
            stop_at = find_stop(text, self.config.stop_strings, self._stop_checked_len)
            self._stop_checked_len = len(text)
            if stop_at is not None:
                run.stop_at = stop_at
                self._finish_main("stop_string")

    def _finish_main(self, reason: str) -> None:
        self.main.state = MainState.DONE
        self.finish_reason = self.finish_reason or reason
        # A promise_end sampled as the last main token is still fed, so that its chunk forks.
        if not any(c.state == ChunkState.FORKING for c in self.chunks):
            self.main.pending = None

    def _commit_chunk(self, chunk: Chunk, token_id: int) -> None:
        chunk.num_sampled += 1
        chunk.num_positions += 1
        tags = self.tag_ids
        if token_id in tags.all:
            self.num_tag_tokens += 1
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
        """max_total_tokens: every thread stops; running chunks are closed as they are, waiting ones dropped. The
        answer is cut (its finish reason) when a thread was: the main thread, or a chunk after the main's eos."""
        if any(c.state in (ChunkState.FORKING, ChunkState.QUEUED, ChunkState.RUNNING) for c in self.chunks):
            self.finish_reason = "max_total_tokens"
        if self.main.state != MainState.DONE:
            # A promise being written is cut like a sentence at the limit, not counted malformed: the chunks spent
            # the shared budget too, which the grammar cannot foresee for the main thread (it closes promises
            # before max_new_tokens only). Its unfinished topic is not answer text, so it is dropped.
            self.parser.abandon()
            self.finish_reason = "max_total_tokens"
            self.main.state = MainState.DONE
        self.main.pending = None
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
        return self.text() if self.done else self._settled.text(self.items)

    def document(self) -> Document:
        return self.renderer.document(self.items)

    def annotated(self) -> str:
        """The response in the inline form (what each thread wrote, malformed parts cleaned away)."""
        return serialize(self.document())

    def token_doc(self) -> TokenDoc:
        """The cleaned structure as ids: a valid TokenDoc (stray tags and dropped promises left out)."""
        # The main thread's eos, whatever ended the answer after it (a budget that cut a chunk running on).
        ended = bool(self.main_ids) and self.main_ids[-1] in self.eos_ids
        return self.renderer.token_doc(self.items, self.main_ids[-1] if ended else None)
