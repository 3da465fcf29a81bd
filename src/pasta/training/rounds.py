"""A preference run's round folders: what a finished round holds, and a run that takes another run's rounds.

`<output_dir>/round-<r>` holds `scores.jsonl` (the sampled, scored candidates), `pairs.jsonl`, `forking.jsonl`,
`checkpoints/`, `final/` (the round's policy) and `metrics.json`; `round-0` the starting policy's held-out check.

`stage.candidates_from=<a preference run's output_dir>` pairs that run's saved candidates again under this run's
settings: an ablation of the pairing or the training (lambda, `stage.rejected_side`, `stage.pair_length_tolerance`,
`stage.beta`, ...) on the same samples: no time spent sampling them again, and no new draw's noise between the
rows compared. `take_saved_rounds` gives the new run, when it starts:
- that run's first `stage.keep_rounds` finished rounds as its own (the models hard-linked, everything else but the
  checkpoints copied), so round keep_rounds + 1 starts from the policy that sampled that round's candidates;
- those candidates (`round-<keep_rounds + 1>/scores.jsonl`), its Baseline-SFT answers and the held-out check of
  its starting policy.
What the new run already holds is kept (a resumed run copies only what a kill left out). The candidates are still
checked against this run's sampling settings (pasta.training.sampling.check_saved_scores); those judged by another
judge or against other references (`judge`, `stage.reference`, `stage.speed_reference`) are judged again under this
run's (pasta.training.sampling.rejudge_saved_scores: an ablation of the judge on the same samples); prompts the
file lacks are sampled from the same policy.

    python -m pasta.train stage=pref ... stage.candidates_from=outputs/pref-a stage.keep_rounds=1 \
        stage.rejected_side=worst output_dir=outputs/pref-a-worst      # round 2 of pref-a, paired best vs worst
    python -m pasta.train stage=pref ... stage.candidates_from=outputs/pref-a stage.reference=output \
        output_dir=outputs/pref-a-gpt4                                  # round 1's candidates judged against `output`
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from pasta.errors import PastaError
from pasta.models import incomplete_weights
from pasta.training.runs import model_source, read_train_info, recorded_model_source, same_source

log = logging.getLogger(__name__)

ROUND_METRICS = "metrics.json"
SCORES = "scores.jsonl"
BASELINE_ANSWERS = "baseline_answers.jsonl"
# What `round_line` and the run's summary read of a round's metrics.json.
_ROUND_METRICS_KEYS = ("round", "mean_score", "mean_score_margin", "train")
# Files never written in place once saved, so a hard link shares them safely (a model is ~0.5 GB per round).
_LINKED_SUFFIXES = (".safetensors", ".bin")


def round_folder(output_dir: Path, round_index: int) -> Path:
    return output_dir / f"round-{round_index}"


def finished_round_metrics(round_path: Path, round_index: int) -> dict[str, Any] | None:
    """The metrics of a round a resumed run finished before, or None when the round has to run (again).

    A round is finished when it wrote its final model and its metrics.json. A metrics.json that does not read back
    (a torn write, an edit) is redone: the round runs again from what it kept, its scored prompts and its last
    checkpoint. A final model whose weights are cut short is one line: it is the next round's policy."""
    final = round_path / "final"
    metrics_path = round_path / ROUND_METRICS
    # A merged or full model has config.json; an adapter (stage.merge_lora=false) adapter_config.json.
    saved = any((final / name).is_file() for name in ("config.json", "adapter_config.json"))
    if not (metrics_path.is_file() and saved):
        return None
    problem = incomplete_weights(final)
    if problem is not None:
        raise PastaError(f"round {round_index}: {problem}: delete {final} and resume to train the round again")
    try:
        metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        if not isinstance(metrics, dict) or not isinstance(metrics.get("train"), dict) \
                or any(key not in metrics for key in _ROUND_METRICS_KEYS):
            raise ValueError("not a round's metrics")
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        log.warning("round %d: %s does not read back (%s): running the round again from its scores and its last "
                    "checkpoint", round_index, metrics_path, exc)
        return None
    return metrics


def check_saved_rounds(source: Path, output_dir: Path, keep_rounds: int, model: Any) -> None:
    """Refuse a `stage.candidates_from` run whose candidates this run could not pair as its own: not a preference
    run, started from other weights (its candidates are another policy's), or without the rounds it is asked for."""
    key = f"stage.candidates_from={source}"
    if not source.is_dir():
        raise PastaError(f"{key}: no such folder (a preference run's output_dir)")
    if source.resolve() == output_dir.resolve():
        raise PastaError(f"{key} is this run's own output_dir: pass resume=true to continue it instead")
    info = read_train_info(source)
    if info is None or info.get("stage") != "pref":
        raise PastaError(f"{key}: not a preference run's output_dir (its train_info.json of stage=pref is missing)")
    saved, now = recorded_model_source(info), model_source(model)
    if saved is not None and not same_source(saved, now):
        raise PastaError(f"{key} started from model {saved}, this run from {now} (model.path): its candidates are "
                         "another policy's")
    for index in range(1, keep_rounds + 1):
        if finished_round_metrics(round_folder(source, index), index) is None:
            raise PastaError(f"{key}: its round {index} is not finished, and stage.keep_rounds={keep_rounds} takes "
                             "it: finish that run first (resume=true), or keep fewer rounds")
    scores = round_folder(source, keep_rounds + 1) / SCORES
    if not scores.is_file():
        raise PastaError(f"{key}: {scores} is missing: that run saved no candidates for round {keep_rounds + 1} "
                         f"(stage.keep_rounds={keep_rounds} re-pairs round keep_rounds + 1)")


def take_saved_rounds(source: Path, output_dir: Path, keep_rounds: int) -> None:
    """Give `output_dir` the rounds and candidates of the run at `source` described in the module docstring
    (checked by `check_saved_rounds`); what `output_dir` already holds is kept."""
    _take(source / BASELINE_ANSWERS, output_dir / BASELINE_ANSWERS)
    for index in range(keep_rounds + 1):  # round-0: the starting policy's held-out check
        _take(round_folder(source, index), round_folder(output_dir, index))
    scores = round_folder(source, keep_rounds + 1) / SCORES
    _take(scores, round_folder(output_dir, keep_rounds + 1) / SCORES)
    num_prompts = sum(1 for line in scores.read_text(encoding="utf-8").splitlines() if line.strip())
    kept = f"its rounds 1-{keep_rounds} (models hard-linked) and " if keep_rounds else ""
    log.info("stage.candidates_from=%s: took %sthe %d scored prompts of its round %d, to pair under this run's "
             "settings", source, kept, num_prompts, keep_rounds + 1)


def _take(source: Path, target: Path) -> None:
    """Copy the file or folder `source` to `target` (checkpoints left out), each file written whole or not at all
    and skipped where `target` has it; weights are hard-linked where the file system allows."""
    if not source.exists():
        return
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for path in files:
        relative = path.relative_to(source)
        if "checkpoints" in relative.parts:
            continue
        dest = target / relative if source.is_dir() else target
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        partial.unlink(missing_ok=True)
        if path.suffix in _LINKED_SUFFIXES:
            try:
                os.link(path, partial)
            except OSError:  # another file system
                shutil.copy2(path, partial)
        else:  # a file this run may append to or rewrite
            shutil.copy2(path, partial)
        os.replace(partial, dest)
