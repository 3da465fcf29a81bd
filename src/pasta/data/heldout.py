"""The held-out pool: the AlpacaEval prompts no training stage may see, and the guard that leaves them out.

Every study evaluates on a seeded subset of AlpacaEval (`eval.subset=N eval.subset_seed=S`, `select_subset`), and
the subsets of one seed are nested: `eval.subset=100` lies inside `eval.subset=300`. The 300 prompts of seed 0 are
the pool held out for evaluation, so no record whose prompt is one of them is ever trained on, whatever data a
run reads (AlpacaEval's own GPT-4 answers, a user's file that happens to hold them, a round's `forking.jsonl`).

Prompts are matched by instruction text, normalised (Unicode NFKC, case-folded, whitespace runs collapsed), not by
position: the instruction alone and the instruction with its input after it (a file may split AlpacaEval's one
prompt into Alpaca's two fields). The pool ships as the hashes of those normalised prompts
(`heldout_pool.txt`), so the guard works where the AlpacaEval file is absent; `python scripts/heldout_pool.py`
writes it from the AlpacaEval file with `select_subset`, and tests/test_data_heldout.py checks that it still
matches.
"""

from __future__ import annotations

import functools
import hashlib
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pasta.errors import PastaError

HELDOUT_POOL_SIZE = 300
HELDOUT_POOL_SEED = 0
POOL_FILE = Path(__file__).with_name("heldout_pool.txt")

T = TypeVar("T")


def _subset_key(instruction: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}\n{instruction}".encode()).hexdigest()


def select_subset(records: list[dict[str, Any]], size: int, seed: int) -> list[dict[str, Any]]:
    """`size` of `records` chosen by `seed`, in their original order.

    Each prompt is ranked by a hash of (seed, instruction) and the `size` lowest are kept. Written out rather than
    with random.sample or numpy: a hash gives the same prompts on every Python and numpy version (their sampling
    streams may change), whatever order or offset the data set is read in, and a larger subset with the same seed
    holds every prompt of a smaller one.
    """
    if size > len(records):
        raise PastaError(f"eval.subset={size} but eval_data selects only {len(records)} prompts")
    chosen = set(sorted(range(len(records)), key=lambda i: _subset_key(records[i]["instruction"], seed))[:size])
    return [record for index, record in enumerate(records) if index in chosen]


def normalize_prompt(text: str) -> str:
    """The text as prompts are matched: NFKC, case-folded, every whitespace run one space, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def prompt_hash(text: str) -> str:
    """The pool file's hash of a prompt: sha256 of its normalised text, first 16 hex digits."""
    return hashlib.sha256(normalize_prompt(text).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def pool_hashes(alpaca_eval: Sequence[dict[str, Any]]) -> list[str]:
    """The hashes of the held-out pool's prompts, chosen from the 805 AlpacaEval records by `select_subset`."""
    pool = select_subset(list(alpaca_eval), HELDOUT_POOL_SIZE, HELDOUT_POOL_SEED)
    return sorted({prompt_hash(record["instruction"]) for record in pool})


@functools.cache
def heldout_pool() -> frozenset[str]:
    """The shipped hashes of the held-out pool's prompts."""
    if not POOL_FILE.is_file():
        raise PastaError(f"the held-out pool is missing: {POOL_FILE}; reinstall pasta")
    hashes = frozenset(line.strip() for line in POOL_FILE.read_text(encoding="utf-8").splitlines() if line.strip())
    if len(hashes) != HELDOUT_POOL_SIZE:
        raise PastaError(f"{POOL_FILE} holds {len(hashes)} prompts, not {HELDOUT_POOL_SIZE}; reinstall pasta")
    return hashes


def is_heldout(instruction: str, input_text: str = "") -> bool:
    """Whether a prompt (instruction, and its input when it has one) is in the held-out pool."""
    pool = heldout_pool()
    if prompt_hash(instruction) in pool:
        return True
    return bool(input_text) and prompt_hash(f"{instruction}\n\n{input_text}") in pool


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
