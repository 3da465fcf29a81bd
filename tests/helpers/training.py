"""Training inputs shared by the stage tests and the architecture matrix: the sample's annotated records and
preference pairs made by hand from them."""

from __future__ import annotations

from pathlib import Path

from pasta.data import Record, read_jsonl
from pasta.training.candidates import Pair, PairSide
from pasta.training.examples import build_sft_examples

ANNOTATED = Path(__file__).resolve().parents[2] / "data" / "annotated_examples.jsonl"


def hand_pairs(tokenizer, num_pairs=2):
    """Chosen: an annotated answer; rejected: the same record's plain answer (so both sides differ)."""
    records = read_jsonl(ANNOTATED)
    chunked = [Record.from_dict(r) for r in records if "<promise" in r["annotated"]][:num_pairs]
    options = {"max_length": 4096, "too_long": "truncate"}
    annotated, _ = build_sft_examples(chunked, tokenizer, strip_annotations=False, **options)
    plain, _ = build_sft_examples(chunked, tokenizer, strip_annotations=True, **options)

    def threads(example):
        return {k: example[k] for k in ("main_ids", "opener_ids", "body_ids", "num_predicted")}

    def side(example):
        return PairSide(index=0, score=0.0, num_malformed=0, speed=1.0, speedup=1.0, quality=None, judge="hand", text="",
                        annotated="", tokens=threads(example))  # fmt: skip

    return [
        Pair(id=str(i), instruction="", judge="hand", quality_weight=1.0, prompt_ids=a["prompt_ids"],
             chosen=side(a), rejected=side(p))  # fmt: skip
        for i, (a, p) in enumerate(zip(annotated, plain, strict=True))
    ]
