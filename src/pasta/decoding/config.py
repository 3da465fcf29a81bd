"""The typed view of a `decode:` config (conf/decode/*.yaml): sampling knobs and the decoder's limits.

Callers turn the composed `cfg.decode` node into a DecodeConfig with `schema_from(cfg.decode, DecodeConfig, "decode")`
(pasta.config, which the decoder may not import): unknown keys and impossible values are a PastaError, so a typo in
a decode file fails loudly. The node's `kind` picks the decoder, which is the caller's choice, not a decoder setting
(schema_from leaves it out); `DECODE_MODES` names the decoders this package runs, for every entry point to check
against.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pasta.errors import PastaError
from pasta.records import as_json, first_difference, with_defaults

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The decoders: PASTA-LANG interpreted as it is written, and the baseline that feeds one token per step.
DECODE_MODES = ("async", "sequential")


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from the logits."""

    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (argmax); > 0 divides the logits before sampling"})
    top_p: float = field(
        default=1.0, metadata={"help": "nucleus sampling: keep the smallest set with mass >= top_p; 1.0 = off"}
    )
    top_k: int = field(default=0, metadata={"help": "keep the k most likely tokens; 0 = all"})
    seed: int | None = field(
        default=None,
        metadata={"help": "request i of a batch samples with seed + i; null = the run's top-level `seed` (pasta.generate), "
                          "else drawn from torch's global RNG"},
    )
    no_repeat_ngram_size: int = field(
        default=0,
        metadata={"help": "a thread never writes the same N tokens twice (transformers' no_repeat_ngram_size, applied "
                          "to each thread's own tokens: the main thread's, tags included, and each chunk's): it "
                          "breaks the loops a small model falls into, for the sequential and the asynchronous "
                          "decoder alike; tags and eos are never banned, and a constrained thread whose legal "
                          "tokens are all banned chooses among them unbanned; 0 = off"},
    )

    def __post_init__(self) -> None:
        if self.no_repeat_ngram_size < 0:
            raise PastaError(f"sampling.no_repeat_ngram_size: must be >= 0 (0 = off), got {self.no_repeat_ngram_size}")
        if not self.temperature >= 0:  # written so that NaN fails too
            raise PastaError(f"sampling.temperature: must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PastaError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise PastaError(f"sampling.top_k: must be >= 0 (0 = no top-k), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class DecodeConfig:
    """Limits and sampling of one decode call; the async-only fields are ignored by the sequential decoder."""

    max_new_tokens: int = field(
        default=256,
        metadata={"help": "tokens the main thread may sample (the whole answer when sequential; when async, its tags "
                          "past decode.free_tag_tokens count too)"},
    )
    stop_strings: tuple[str, ...] = field(
        default=(),
        metadata={"help": "main-thread text that ends the answer: the text stops before it, the ids keep the token "
                          "that completed it"},
    )
    sampling: SamplingConfig = field(default_factory=SamplingConfig, metadata={"help": "token choice"})
    max_threads: int = field(
        default=8,
        metadata={"help": "async: chunk threads running at once per request; later promises wait in a queue"},
    )
    max_chunk_tokens: int = field(
        default=256,
        metadata={"help": "async: tokens one chunk may sample before it is force-closed (counted in "
                          "stats.malformed.chunk_cap)"},
    )
    max_total_tokens: int | None = field(
        default=None,
        metadata={"help": "async: tokens all threads of a request may sample together (tags past "
                          "decode.free_tag_tokens included); null = max_new_tokens, the budget a sequential answer "
                          "gets (a larger number lets a forked answer hold more)"},
    )
    free_tag_tokens: int = field(
        default=64,
        metadata={"help": "async: tag tokens an answer may sample without spending max_new_tokens or max_total_tokens "
                          "(<|promise|>, a topic, its count, <|promise_end|>, <|sync|>, a chunk's <|async_end|>): the "
                          "budgets then count the answer's text, as a sequential answer's count its text, so a fork "
                          "does not cost the answer words; past this many, tags spend the budgets as text does; 0 = "
                          "every sampled token spends them"},
    )
    max_promises: int | None = field(
        default=16,
        metadata={"help": "async, with decode.constrain: promises one answer may make; past it the main thread writes "
                          "on without forking (a runaway promise list whose topics loop otherwise spends the budget "
                          "on tags; masked choices counted in stats.masked.promise_cap); null = no cap"},
    )
    stop_topic_loops: bool = field(
        default=False,
        metadata={"help": "async, with decode.constrain: once a topic extends an earlier one of the answer word by word "
                          "('The most likely', 'The most likely to', ...: a student repeating a topic the grammar will "
                          "not let it repeat), the main thread writes on without forking (masked choices counted in "
                          "stats.masked.promise_cap); off by default: a well-formed list may hold such topics "
                          "('Python', 'Python libraries'), and it costs forks"},
    )
    max_topic_chars: int = field(
        default=64,
        metadata={"help": "async, with decode.constrain: characters a promise's topic may hold (at most the "
                          "language's 100): a topic is a short label, and one that runs on loops ('a timeline and a "
                          "budget and a timeline and ...'); the structural teacher's topics are under 60"},
    )
    constrain: bool = field(
        default=True,
        metadata={"help": "async: the sampler never picks a token that would make a thread's PASTA-LANG malformed "
                          "(a tag the decoder supplies, eos or a stray tag inside a promise, a duplicate topic, a "
                          "count that is not digits, ...; pasta/decoding/grammar.py; replaced choices counted in "
                          "stats.masked by the malformed event they avoided); false = the model's own choices, "
                          "malformed ones decoded as text and counted in stats.malformed, for measuring what the "
                          "model writes on its own"},
    )
    draft_skeleton: bool = field(
        default=False,
        metadata={"help": "async: feed a guess of the main thread's next tokens beside its token each step "
                          "(<|promise_end|> after a topic token, the next list item's marker, <|promise|>: "
                          "pasta/decoding/draft.py) and keep the guessed tokens the model chooses anyway, so a list "
                          "takes fewer steps; a greedy answer is the same token for token, unless max_total_tokens "
                          "cuts it (what each thread had written when the budget ran out depends on the steps); a "
                          "sampled one is distributed as without the draft, but a seed draws another sample"},
    )
    cpu_multirow_linears: bool = field(
        default=True,
        metadata={"help": "CPU, 2+ torch threads: decode steps of up to 8 rows run linear layers as W @ x^T, which "
                          "MKL spreads over every thread (x @ W^T runs one row at a time on one thread; "
                          "pasta/decoding/linears.py); the prefill and larger steps, or false: transformers' own "
                          "F.linear"},
    )
    compile: bool = field(
        default=False,
        metadata={"help": "torch.compile the decode steps of both decoders (pasta/decoding/step.py): the first decode "
                          "pays the compilation (minutes on a CPU), later ones reuse it and the cache stores the last "
                          "one released (kept allocated, so CUDA graphs replay); greedy answers stay the eager ones. "
                          "A step that cannot be compiled (no C++ compiler, an unsupported op) stops with an error; "
                          "false = eager"},
    )
    compile_mode: str | None = field(
        default=None,
        metadata={"help": "torch.compile mode with decode.compile: default, reduce-overhead (CUDA graphs), "
                          "max-autotune, max-autotune-no-cudagraphs; null = reduce-overhead on CUDA, default "
                          "elsewhere"},
    )

    def __post_init__(self) -> None:
        # A config node gives a list; a tuple keeps the frozen config hashable.
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if self.max_new_tokens < 1:
            raise PastaError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if self.max_threads < 1:
            raise PastaError(f"max_threads: must be >= 1, got {self.max_threads}")
        if self.max_chunk_tokens < 1:
            raise PastaError(f"max_chunk_tokens: must be >= 1, got {self.max_chunk_tokens}")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise PastaError(f"max_total_tokens: must be >= 1 or null, got {self.max_total_tokens}")
        if self.free_tag_tokens < 0:
            raise PastaError(f"free_tag_tokens: must be >= 0, got {self.free_tag_tokens}")
        if self.max_topic_chars < 1:
            raise PastaError(f"max_topic_chars: must be >= 1, got {self.max_topic_chars}")
        if self.max_promises is not None and self.max_promises < 1:
            raise PastaError(f"max_promises: must be >= 1 or null, got {self.max_promises}")
        if any(not s for s in self.stop_strings):
            raise PastaError("stop_strings: may not contain an empty string")
        if self.compile_mode is not None and self.compile_mode not in COMPILE_MODES:
            raise PastaError(f"compile_mode: one of {', '.join(COMPILE_MODES)} or null, got {self.compile_mode}")

    @property
    def total_token_budget(self) -> int:
        """Tokens all threads of an async request may spend together (tags within free_tag_tokens spend nothing).
        By default a sequential answer's budget: otherwise a forked answer could run its main thread to
        max_new_tokens and as many again in each chunk, and a comparison with the sequential decoder would give it
        more text to write."""
        return self.max_new_tokens if self.max_total_tokens is None else self.max_total_tokens


def decode_difference(recorded: Any, asked: dict) -> tuple[str, Any, Any] | None:
    """Where a run file's recorded decode config differs from this run's `asked` (both through JSON), as (`decode.`
    dotted key, recorded value, asked value), or None when they agree. A setting added since the file was written
    reads as its default: the run that wrote it decoded that way."""
    recorded = with_defaults(recorded, as_json(asdict(DecodeConfig())))
    return None if recorded == asked else first_difference("decode", recorded, asked)
