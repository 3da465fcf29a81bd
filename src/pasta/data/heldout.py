"""The held-out pool: the AlpacaEval prompts no training stage may see, and the guard that leaves them out.

Every study evaluates on a seeded subset of AlpacaEval (`eval.subset=N eval.subset_seed=S`, `select_subset`), and
the subsets of one seed are nested: `eval.subset=100` lies inside `eval.subset=300`. The 300 prompts of seed 0 are
the pool held out for evaluation, so no record whose prompt is one of them is ever trained on, whatever data a
run reads (AlpacaEval's own GPT-4 answers, a user's file that happens to hold them, a round's `forking.jsonl`).

Prompts are matched by their normalised text (Unicode NFKC, case-folded, whitespace runs collapsed, typographic
quotes folded, invisible format characters such as zero-width spaces dropped), not by position, and a prompt is
found wherever a copy of it stands on lines of its own: the instruction, its input, the two joined either way
round (a file may split AlpacaEval's one prompt into Alpaca's two fields, or swap them), or whole lines of a longer
message (under a system prompt, after a "User:" or "### Instruction:" label, inside a chat template's markers).
A pool prompt inside a sentence of other words is not matched: "<prompt> Answer briefly." is a training prompt
of its own. The pool ships as the hashes of its normalised prompts, in the order the seed ranks them
(`heldout_pool.txt`), so the guard works where the AlpacaEval file is absent; `python scripts/heldout_pool.py`
writes it from the AlpacaEval file, and tests/test_data_heldout.py checks that it still matches.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pasta.errors import PastaError

HELDOUT_POOL_SIZE = 300
HELDOUT_POOL_SEED = 0
POOL_FILE = Path(__file__).with_name("heldout_pool.txt")

T = TypeVar("T")


# The most lines a pool prompt spans (tests/test_data_heldout.py checks it): the longest run of lines matched.
MAX_POOL_PROMPT_LINES = 23

# Chat-template markers a prompt may be wrapped in, each read as a line break: ChatML, Llama-3 and Phi `<|...|>`,
# Llama-2 `[INST]` and `<<SYS>>`, Gemma's turns, `<s>`.
_TEMPLATE_MARKERS = re.compile(r"<\|[^|<>\n]{1,40}\|>|\[/?INST\]|<</?SYS>>|</?s>|<(?:start|end)_of_turn>|<bos>|<eos>",
                               re.IGNORECASE)
# A role or field label before a prompt on its line ("user: ", "### instruction: ", "q: "), in normalised text.
_LABEL = re.compile(r"^(?:#{1,6} ?)?[^\W\d][\w '-]{0,30}: ?")
# Typographic quotes a copy may carry for ASCII ones.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
                         "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"'})


def _subset_key(instruction: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}\n{instruction}".encode()).hexdigest()


def _ranked(records: Sequence[dict[str, Any]], seed: int, first: dict[str, int] | None = None) -> list[int]:
    """The records' positions, lowest hash of (seed, instruction) first: how a seed defines its subsets. `first`
    (prompt hash -> rank) puts the prompts it names before all others, in its order."""
    def key(index: int) -> tuple[int, str]:
        instruction = records[index]["instruction"]
        lead = first.get(prompt_hash(instruction), len(first)) if first else 0
        return lead, _subset_key(instruction, seed)

    return sorted(range(len(records)), key=key)


def select_subset(records: list[dict[str, Any]], size: int, seed: int) -> list[dict[str, Any]]:
    """`size` of `records` chosen by `seed`, in their original order.

    Each prompt is ranked by a hash of (seed, instruction) and the `size` lowest are kept. Written out rather than
    with random.sample or numpy: a hash gives the same prompts on every Python and numpy version (their sampling
    streams may change), whatever order or offset the data set is read in, and a larger subset with the same seed
    holds every prompt of a smaller one. Under the pool's seed the pool's prompts, recognised by their normalised
    text, rank first and in the pool's order: on the AlpacaEval file that is the hash ranking itself, and a copy
    whose instructions were reformatted (stripped, CRLF, another Unicode form) still selects inside the pool.
    """
    if size > len(records):
        raise PastaError(f"eval.subset={size} but eval_data selects only {len(records)} prompts")
    pool_ranks = ({prompt: rank for rank, prompt in enumerate(heldout_pool_ranked())} if seed == HELDOUT_POOL_SEED
                  else None)
    ranked = _ranked(records, seed, first=pool_ranks)
    chosen = set(ranked[:size])
    return [record for index, record in enumerate(records) if index in chosen]


def normalize_prompt(text: str) -> str:
    """The text as prompts are matched: NFKC, format characters (Unicode Cf: zero-width spaces, a BOM, soft hyphens)
    dropped, typographic quotes folded to ASCII, case-folded, every whitespace run one space, stripped."""
    text = unicodedata.normalize("NFKC", text)
    if not text.isascii():
        text = "".join(char for char in text if unicodedata.category(char) != "Cf").translate(_QUOTES)
    return " ".join(text.casefold().split())


def prompt_key(instruction: str, input_text: str = "") -> str:
    """What makes two records prompts of the same question: their instruction and input, normalised."""
    return normalize_prompt(f"{instruction}\n\n{input_text}")


def prompt_hash(text: str) -> str:
    """The pool file's hash of a prompt: sha256 of its normalised text, first 16 hex digits."""
    return _hash_normalized(normalize_prompt(text))


def _hash_normalized(normalized: str) -> str:
    return hashlib.sha256(normalized.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def pool_hashes(alpaca_eval: Sequence[dict[str, Any]]) -> list[str]:
    """The hashes of the held-out pool's prompts, in rank order: the 300 of the 805 AlpacaEval records that seed 0
    ranks lowest (`select_subset`'s hash ranking)."""
    hashes: list[str] = []
    for index in _ranked(alpaca_eval, HELDOUT_POOL_SEED):
        prompt = prompt_hash(alpaca_eval[index]["instruction"])
        if prompt not in hashes:
            hashes.append(prompt)
        if len(hashes) == HELDOUT_POOL_SIZE:
            break
    return hashes


@functools.cache
def heldout_pool_ranked() -> tuple[str, ...]:
    """The shipped hashes of the held-out pool's prompts, in the order seed 0 ranks them."""
    if not POOL_FILE.is_file():
        raise PastaError(f"the held-out pool is missing: {POOL_FILE}; reinstall pasta")
    hashes = tuple(line.strip() for line in POOL_FILE.read_text(encoding="utf-8").splitlines() if line.strip())
    if len(set(hashes)) != HELDOUT_POOL_SIZE:
        raise PastaError(f"{POOL_FILE} holds {len(set(hashes))} prompts, not {HELDOUT_POOL_SIZE}; reinstall pasta")
    return hashes


@functools.cache
def heldout_pool() -> frozenset[str]:
    """The shipped hashes of the held-out pool's prompts."""
    return frozenset(heldout_pool_ranked())


def _prompt_lines(text: str) -> list[str]:
    """The text's non-empty lines, normalised, chat-template markers read as line breaks."""
    return [line for line in map(normalize_prompt, _TEMPLATE_MARKERS.sub("\n", text).splitlines()) if line]


def _run_hashes(lines: Sequence[str], crossing: int | None = None) -> Iterator[str]:
    """The hashes of every run of up to MAX_POOL_PROMPT_LINES of `lines`, each also without a label before its
    first line; with `crossing`, only the runs that hold both line `crossing - 1` and line `crossing`."""
    for start in range(len(lines) if crossing is None else crossing):
        first_end = start + 1 if crossing is None else max(start + 1, crossing + 1)
        for end in range(first_end, min(len(lines), start + MAX_POOL_PROMPT_LINES) + 1):
            run = " ".join(lines[start:end])
            yield _hash_normalized(run)
            unlabelled = _LABEL.sub("", run, count=1)
            if unlabelled != run and unlabelled:
                yield _hash_normalized(unlabelled)


def is_heldout(instruction: str, input_text: str = "") -> bool:
    """Whether a prompt (instruction, and its input when it has one) holds a held-out pool prompt on lines of its
    own: alone, joined with the other field either way round, or among other lines."""
    pool = heldout_pool()
    if not input_text:
        return prompt_hash(instruction) in pool or any(h in pool for h in _run_hashes(_prompt_lines(instruction)))
    instruction_lines, input_lines = _prompt_lines(instruction), _prompt_lines(input_text)
    whole = (prompt_hash(f"{instruction}\n{input_text}"), prompt_hash(f"{input_text}\n{instruction}"))
    # The runs inside one field are the same in either order: only the runs across the swapped boundary are new.
    runs = itertools.chain(_run_hashes(instruction_lines + input_lines),
                           _run_hashes(input_lines + instruction_lines, crossing=len(input_lines)))
    return any(h in pool for h in whole) or any(h in pool for h in runs)


def leave_out_heldout(records: Iterable[T], prompt_of=lambda r: (r["instruction"], r.get("input") or "")
                      ) -> tuple[list[T], int]:
    """(the records whose prompt is not in the held-out pool, how many were left out); `prompt_of` gives a record's
    (instruction, input)."""
    kept: list[T] = []
    num_left_out = 0
    for record in records:
        instruction, input_text = prompt_of(record)
        if isinstance(instruction, str) and is_heldout(instruction, input_text if isinstance(input_text, str) else ""):
            num_left_out += 1
        else:
            kept.append(record)
    return kept, num_left_out
