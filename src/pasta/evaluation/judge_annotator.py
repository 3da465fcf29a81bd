"""A pasta judge (the `judge/` group) in the place of alpaca_eval's annotator: it turns the judge's P(candidate
beats reference) into alpaca_eval preferences (1 + p, in [1, 2]) and appends each chunk of verdicts to
judge_pairs.jsonl, so a rerun judges only the pairs not yet there."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from pasta.data import JsonlAppender, iter_numbered_jsonl
from pasta.errors import PastaError
from pasta.evaluation.annotations import preference_problem
from pasta.judges import Judge, JudgeItem

log = logging.getLogger(__name__)


# Judge settings that change how a verdict is reached (where, how fast, how often retried), not what it is: the same
# served model at another address (base_url) gives the same verdicts.
_OPERATIONAL_SETTINGS = frozenset({"device", "batch_size", "progress", "concurrency", "max_retries", "timeout_s",
                                   "max_consecutive_errors", "api_key_env", "parse_retries", "base_url"})


def judge_settings(judge_cfg: Any) -> str:
    """A hash of the judge settings that decide its verdicts (its model and checkpoint, prompts, order, sampling):
    the judge's name alone ("hf:smollm2-135m") is the same for another checkpoint or prompt."""
    from omegaconf import DictConfig, OmegaConf

    values = OmegaConf.to_container(judge_cfg, resolve=True) if isinstance(judge_cfg, DictConfig) else dict(judge_cfg)
    kept = {key: value for key, value in values.items() if key not in _OPERATIONAL_SETTINGS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def _pair_key(instruction: str, reference: str, candidate: str) -> str:
    # Both answers are in the key: a pair whose candidate changed (regenerated outputs) is judged again.
    return hashlib.sha256("\x00".join((instruction, reference, candidate)).encode("utf-8")).hexdigest()[:24]


class JudgeAnnotator:
    """A pasta judge in the place of alpaca_eval's PairwiseAnnotator (`alpaca_eval.evaluate(Annotator=...)`).

    alpaca_eval builds it as `JudgeAnnotator(annotators_config=..., **annotator_kwargs)` and calls
    `annotate_head2head(outputs_1=reference, outputs_2=model)`; the rows it returns are alpaca_eval annotations.
    """

    def __init__(self, annotators_config: str, *, judge: Judge, pairs_path: Path, chunk_size: int = 16,
                 settings: str | None = None):
        self.annotator_name = annotators_config
        self.judge = judge
        self.settings = settings  # judge_settings(): verdicts under other settings are not this judge's
        self.pairs_path = Path(pairs_path)
        self.chunk_size = chunk_size

    def _judged(self) -> dict[str, float | None]:
        if not self.pairs_path.is_file():
            return {}
        judged = {}
        for line_no, record in iter_numbered_jsonl(self.pairs_path):
            if not isinstance(record.get("key"), str) or preference_problem(record.get("preference")) is not None:
                raise PastaError(
                    f"{self.pairs_path}:{line_no}: not a judge verdict (a 'key' string and a preference in [1, 2] "
                    "or null); score into another output_dir or delete that file"
                )
            if record.get("annotator") != self.annotator_name:
                raise PastaError(
                    f"{self.pairs_path} holds verdicts of {record.get('annotator')!r}, not of {self.annotator_name!r}; "
                    "score into another output_dir or delete that file"
                )
            # A verdict recorded before the settings were kept is taken as this judge's.
            if None not in (self.settings, record.get("settings")) and record["settings"] != self.settings:
                raise PastaError(
                    f"{self.pairs_path} holds verdicts of {self.annotator_name!r} under other judge settings (its "
                    "model, checkpoint, prompts or order); score into another output_dir or delete that file"
                )
            if record["preference"] is not None:  # a pair the judge gave up on is asked again on a rerun
                judged[record["key"]] = record["preference"]
        return judged

    def annotate_head2head(
        self, outputs_1: pd.DataFrame | Sequence[dict], outputs_2: pd.DataFrame | Sequence[dict], **_: Any
    ) -> list[dict[str, Any]]:
        references = pd.DataFrame(outputs_1)
        candidates = pd.DataFrame(outputs_2)
        pairs = candidates.merge(
            references[["instruction", "output", "generator"]], on="instruction", suffixes=("_2", "_1")
        )
        # Opening the appender first drops a verdict line that a kill cut short, before the verdicts are read back.
        with JsonlAppender(self.pairs_path) as out:
            return self._annotate(pairs, out)

    def _annotate(self, pairs: pd.DataFrame, out: JsonlAppender) -> list[dict[str, Any]]:
        judged = self._judged()
        rows = [
            {
                "instruction": row.instruction,
                "output_1": row.output_1,
                "generator_1": row.generator_1,
                "output_2": row.output_2,
                "generator_2": row.generator_2,
                "annotator": self.annotator_name,
                "key": _pair_key(row.instruction, row.output_1, row.output_2),
            }
            for row in pairs.itertuples(index=False)
        ]
        for row in rows:
            if row["output_1"] == row["output_2"]:
                judged[row["key"]] = 1.5  # a tie without asking, as alpaca_eval's own annotators do
        todo = [row for row in rows if row["key"] not in judged]
        if todo:
            log.info("judging %d of %d pairs with %s", len(todo), len(rows), self.annotator_name)
        # A bar closed on the way out too: an error leaves it with its line ended, and `error:` on a line of its own.
        with tqdm(total=len(todo), desc=f"judge {self.annotator_name}", disable=not todo) as progress:
            for start in range(0, len(todo), self.chunk_size):
                chunk = todo[start : start + self.chunk_size]
                items = [JudgeItem(r["instruction"], candidate=r["output_2"], reference=r["output_1"]) for r in chunk]
                try:
                    probabilities = self.judge.compare(items)
                except PastaError:
                    raise
                except Exception as exc:
                    raise PastaError(
                        f"judge {self.annotator_name} failed after {len(rows) - len(todo) + start} of {len(rows)} "
                        f"pairs ({type(exc).__name__}: {exc}); they are saved in {self.pairs_path}: rerun to resume"
                    ) from exc
                for row, probability in zip(chunk, probabilities, strict=True):
                    # None = the judge gave up on this pair; alpaca_eval drops a NaN preference from the metrics.
                    preference = None if probability is None else 1.0 + float(probability)
                    judged[row["key"]] = preference
                    out.append({"key": row["key"], "annotator": self.annotator_name, "settings": self.settings,
                                "preference": preference})
                progress.update(len(chunk))
        return [{**row, "preference": judged[row["key"]]} for row in rows]
