"""What a decode returns per request: the text, its annotated form and structure, and the stats of the run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from pasta.lang import TokenDoc

# The finish reasons of an answer that ended by itself, and of one its budget cut (all threads' tokens together for
# max_total_tokens): every finish reason a decode records is in one of the two.
ENDED_BY_ITSELF = ("eos", "stop_string")
BUDGET_CUTS = ("max_new_tokens", "max_total_tokens")


@dataclass
class DecodeStats:
    """Counts and timings of one request. The timings are its RequestClock's (pasta/decoding/timing.py defines
    them): a step's time counts whole for every request in it."""

    num_tokens: int = 0  # tokens sampled by all threads (decoder-supplied openers are not sampled)
    num_steps: int = 0  # forward passes this request took part in, prefill included
    prefill_s: float = 0.0  # the step that fed the prompt (plan, pack, forward, choose, commit)
    decode_s: float = 0.0  # every later step this request took part in
    wall_s: float = 0.0  # prefill_s + decode_s
    bookkeeping_s: float = 0.0  # the steps' host work: planning, packing, committing (part of wall_s)
    forward_s: float = 0.0  # the steps' forwards (on CUDA: until the device finished them)
    choose_s: float = 0.0  # the steps' choices of tokens (sampling, or scoring forced tokens)
    num_threads: int = 0  # chunk threads forked
    num_overruns: int = 0  # chunks that wrote past the positions reserved for them
    malformed: dict[str, int] = field(default_factory=dict)  # malformed-output events by kind
    masked: dict[str, int] = field(default_factory=dict)  # decode.constrain: choices replaced, by the event avoided
    num_forced: int = 0  # decode.constrain: tokens the grammar left no choice for (jump-forward's steps to save)
    num_drafted: int = 0  # decode.draft_skeleton: guessed main-thread tokens fed beside the main thread's own
    num_draft_kept: int = 0  # of them, the ones the model chose (each a step the main thread did not take)
    finish_reason: str = ""  # eos | stop_string | max_new_tokens | max_total_tokens
    # Rows each forward fed for this request, prefill (the prompt) first: what a step costs grows with them and
    # with the cache it attends (their running sum), so its latency alone is priced on the cost model
    # (pasta/decoding/cost_model.py) from these.
    step_rows: list[int] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        """The answer ended by itself (eos or a stop string), not at its budget."""
        return self.finish_reason in ENDED_BY_ITSELF

    @property
    def theoretical_speedup(self) -> float:
        """Tokens per forward step: what an ideal machine gains over one token per step."""
        return self.num_tokens / self.num_steps if self.num_steps else 1.0

    def to_dict(self) -> dict:
        return {**asdict(self), "theoretical_speedup": self.theoretical_speedup}


@dataclass
class DecodeResult:
    """One request's answer."""

    text: str  # the plain text a reader sees (chunks spliced in, tags removed)
    annotated: str  # the inline PASTA-LANG form; equal to `text` for the sequential decoder
    token_doc: TokenDoc | None  # what each thread sampled, cleaned of malformed tags; None for sequential
    token_ids: list[int]  # the main thread's sampled ids, as sampled (the whole answer when sequential)
    stats: DecodeStats

    def to_dict(self) -> dict:
        """JSON-ready: text, annotated, token_ids and every stat at the top level."""
        return {"text": self.text, "annotated": self.annotated, "token_ids": self.token_ids,
                **self.stats.to_dict()}


@dataclass
class TokenLogprobs:
    """Log-probabilities of a teacher-forced response, per sampled token, thread by thread."""

    main: torch.Tensor  # [len(token_doc.main_ids)]
    chunks: list[torch.Tensor]  # chunk k: [len(token_doc.chunks[k].body_ids)]

    def total(self) -> torch.Tensor:
        """The sequence log-probability: the sum over every sampled token."""
        return self.main.sum() + sum((c.sum() for c in self.chunks), torch.zeros(()))
