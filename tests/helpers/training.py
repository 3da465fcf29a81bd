"""Training inputs shared by the stage tests and the architecture matrix: the sample's annotated records and
preference pairs made by hand from them."""

from __future__ import annotations

from pathlib import Path

from pasta.data import Record, read_jsonl
from pasta.training.pairs import record_pairs

ANNOTATED = Path(__file__).resolve().parents[2] / "data" / "annotated_examples.jsonl"


def hand_pairs(tokenizer, num_pairs=2):
    """Chosen: an annotated answer; rejected: the same record's plain answer (so both sides differ)."""
    chunked = [Record.from_dict(r) for r in read_jsonl(ANNOTATED) if "<promise" in r["annotated"]][:num_pairs]
    return record_pairs(chunked, tokenizer, max_length=4096, judge="hand")
