"""Quality of an evaluated run through the `alpaca_eval` library: win rate and length-controlled win rate.

Three ways to get annotations, one way to turn them into metrics:

- an alpaca_eval annotator (`eval.annotators_config=weighted_alpaca_eval_gpt4_turbo`, any alpaca_eval config name
  or a path to one): `alpaca_eval.evaluate` with local `reference_outputs`; its annotator caches verdicts in
  alpaca_eval_cache.json after each chunk, so a rerun after a failure asks only for the missing ones (the judge's
  raw answers redacted first, pasta.errors.redact);
- the pasta judge of the `judge/` group (`eval.annotators_config=null`, judge=hf|openai): the same
  `alpaca_eval.evaluate`, with `JudgeAnnotator` (pasta.evaluation.judge_annotator) in place of alpaca_eval's
  annotator; it turns the judge's P(candidate beats reference) into alpaca_eval preferences (1 + p, in [1, 2]) and
  appends each chunk to judge_pairs.jsonl, so a rerun judges only the pairs not yet there;
- saved alpaca_eval annotations (`eval.annotations=PATH/annotations.json`, checked by
  pasta.evaluation.annotations): no judge is called.

Metrics always come from alpaca_eval's own functions: `metrics.get_winrate` for the win rate, and
`metrics.get_length_controlled_winrate` (GLM `length_controlled_v1`) for the LC win rate. That GLM fits the
model's annotations jointly with alpaca_eval's `df_gamed.csv` (the GPT-4 Turbo judge's verdicts on verbose and
concise GPT-4 baselines, and per-instruction difficulty fitted over the whole leaderboard), downloaded from the
hub. Offline that file is out of reach, and the shared fixtures' verbose/concise outputs do not replace it: the GLM
needs the judge's verdicts on them, not the outputs. `eval.length_controlled`:
- auto: the official LC when df_gamed.csv can be had, else none (the raw win rate only, with the reason);
- official: the official LC or an error;
- offline: `lc_winrate_offline_estimate`, alpaca_eval's `length_controlled_minimal` GLM fitted on this run's
  annotations alone. It is NOT comparable with the leaderboard: on the alpaca-7b fixture it gives 19.5 where the
  leaderboard's LC is 5.9, because without the gamed baselines the length term also absorbs quality;
- off: the raw win rate only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from pasta.endpoints import error_message
from pasta.errors import PastaError, redact
from pasta.evaluation.annotations import load_annotations
from pasta.evaluation.eval_set import ALPACA_EVAL_SIZE
from pasta.evaluation.judge_annotator import JudgeAnnotator
from pasta.evaluation.run_files import ALPACA_EVAL_CACHE, JUDGE_PAIRS
from pasta.judges import Judge

LC_MODES = ("auto", "official", "offline", "off")
# AlpacaEval 2.0's judge and reference: only a run with both has LC numbers comparable with the leaderboard.
LEADERBOARD_ANNOTATOR = "weighted_alpaca_eval_gpt4_turbo"
LEADERBOARD_REFERENCE = "gpt4_1106_preview"
# GroupKFold in alpaca_eval's GLM fit needs several prompts per fold.
MIN_PROMPTS_FOR_GLM = 10


def annotator_slug(name: str) -> str:
    """A folder name for an annotator's results (alpaca_eval keeps each annotator's results in its own folder)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "annotator"


# --------------------------------------------------------------------------------------------- metrics


def _official_lc_available() -> tuple[bool, str]:
    """Whether alpaca_eval's df_gamed.csv can be had (cached, or downloadable); else why not."""
    from alpaca_eval import constants
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(
            repo_id="tatsu-lab/alpaca_eval", filename="df_gamed.csv", repo_type="dataset",
            token=constants.DATASETS_TOKEN, cache_dir=constants.DEFAULT_CACHE_DIR,
        )
    except Exception as exc:  # offline, no route, hub error: all mean "not available here"
        return False, f"alpaca_eval's df_gamed.csv could not be fetched from the hub ({type(exc).__name__})"
    return True, ""


def _offline_lc_estimate(annotations: pd.DataFrame) -> float:
    """alpaca_eval's `length_controlled_minimal` GLM fitted on these annotations alone (see the module docstring)."""
    from alpaca_eval.metrics import glm_winrate

    glm = glm_winrate.GLM_INFO["length_controlled_minimal"]
    delta_len = annotations["output_1"].str.len() - annotations["output_2"].str.len()
    spread = delta_len.std()
    features = pd.DataFrame(
        {
            "preference": annotations["preference"].astype(float).replace({0.0: 1.5}) - 1,
            "std_delta_len": delta_len / spread if spread > 0 else delta_len * 0.0,
            "not_gamed_baseline": True,
        }
    ).reset_index(drop=True)
    features = features[features["preference"].notna()]
    test = features[["not_gamed_baseline"]].copy()
    test["std_delta_len"] = 0.0  # the win rate the GLM predicts for equally long answers
    train, test_matrix = glm_winrate.make_dmatrix_for_model(features, test, formula=glm["formula"])
    model = glm_winrate.fit_LogisticRegressionCV(train, "preference", is_ytrue_proba=True, **glm["kwargs"])
    return float(model.predict_proba(test_matrix)[:, 1].mean() * 100)


def make_metric_fn(
    positions: dict[str, int] | None, lc_mode: str = "auto"
) -> Callable[[pd.DataFrame | Sequence[dict]], dict[str, Any]]:
    """The `fn_metric` given to alpaca_eval: its win rate, plus an LC win rate as `lc_mode` and the data allow.

    `positions` maps each instruction to its index in the full 805-prompt AlpacaEval set, which is how alpaca_eval's
    GLM looks up instruction difficulty; None when the evaluation set is not AlpacaEval (official LC impossible).
    """
    if lc_mode not in LC_MODES:
        raise PastaError(f"eval.length_controlled={lc_mode} is not one of {', '.join(LC_MODES)}")

    def metric_fn(annotations: pd.DataFrame | Sequence[dict]) -> dict[str, Any]:
        from alpaca_eval import metrics as ae_metrics

        frame = pd.DataFrame(annotations).reset_index(drop=True)
        frame["preference"] = pd.to_numeric(frame["preference"], errors="coerce")
        result: dict[str, Any] = {k: _plain(v) for k, v in ae_metrics.get_winrate(frame).items()}
        result["n_unjudged"] = int(frame["preference"].isna().sum())
        judged = frame[frame["preference"].notna()]
        if lc_mode in ("auto", "official"):
            result.update(_official_lc(judged, positions, lc_mode))
        elif lc_mode == "offline":
            result.update(_offline_lc(judged))
        return result

    return metric_fn


def _official_lc(judged: pd.DataFrame, positions: dict[str, int] | None, lc_mode: str) -> dict[str, Any]:
    """alpaca_eval's length-controlled win rate, or (auto) why there is none; official without one is an error."""
    from alpaca_eval import metrics as ae_metrics

    why = _why_no_official_lc(judged, positions)
    if why is None:
        # alpaca_eval reads instruction difficulty by the frame's index: it must be the AlpacaEval position.
        indexed = judged.set_index(judged["instruction"].map(positions).rename(None))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # sklearn's deprecations inside alpaca_eval
            lc = ae_metrics.get_length_controlled_winrate(
                indexed, save_weights_dir=None, is_add_glm_preference_inplace=False
            )
        return {
            "length_controlled_winrate": _plain(lc["length_controlled_winrate"]),
            "lc_standard_error": _plain(lc["lc_standard_error"]),
            "lc_method": "alpaca_eval length_controlled_v1",
        }
    if lc_mode == "official":
        raise PastaError(f"eval.length_controlled=official, but {why}; use auto or offline")
    # auto: no LC rather than a number that reads like the leaderboard's and is not.
    return {"lc_unavailable": f"{why}; eval.length_controlled=offline gives a non-comparable estimate"}


def _why_no_official_lc(judged: pd.DataFrame, positions: dict[str, int] | None) -> str | None:
    """Why the official LC cannot be computed for these annotations, or None when it can."""
    if positions is None:
        return f"the evaluation set is not the {ALPACA_EVAL_SIZE}-prompt AlpacaEval set"
    # alpaca_eval's GLM standardises the length difference: one pair, or pairs all alike, leave it nothing to fit
    # (and make it fail on the index it writes back).
    if len(judged) < MIN_PROMPTS_FOR_GLM:
        return f"{len(judged)} judged pairs: too few to fit the length GLM"
    length_gap = judged["output_2"].astype(str).str.len() - judged["output_1"].astype(str).str.len()
    if not length_gap.std() > 0:
        return "every judged pair differs in length alike: the length GLM has nothing to fit"
    available, why = _official_lc_available()
    if not available:
        return why
    unknown = [i for i in judged["instruction"] if i not in positions]
    if unknown:
        return f"instruction not in AlpacaEval: {unknown[0][:60]!r}"
    return None


def _offline_lc(judged: pd.DataFrame) -> dict[str, Any]:
    """The offline LC estimate, labelled as not comparable, or why there is none."""
    if len(judged) < MIN_PROMPTS_FOR_GLM:
        return {"lc_unavailable": f"{len(judged)} judged pairs: too few to fit the length GLM"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        estimate = _offline_lc_estimate(judged)
    return {
        "lc_winrate_offline_estimate": estimate,
        "lc_method": (
            "offline estimate: alpaca_eval length_controlled_minimal GLM on this run's annotations alone, "
            "without df_gamed.csv; NOT comparable with the AlpacaEval leaderboard"
        ),
    }


def _plain(value: Any) -> Any:
    """numpy scalars -> Python numbers (JSON), NaN -> None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


# ------------------------------------------------------------------------------------------------ entry points


class _DropTracebacks(logging.Filter):
    """Keeps a library's log records but drops the traceback they carry."""

    def __init__(self, package: str):
        super().__init__()
        self.package_dir = f"{os.sep}{package}{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and self.package_dir in record.pathname:
            record.exc_info, record.exc_text = None, None
        return True


@contextlib.contextmanager
def _without_library_tracebacks(package: str) -> Iterator[None]:
    """While inside, log records from `package` lose their tracebacks: alpaca_eval logs the traceback of an API
    error it then re-raises, and pasta reports that error on one line instead."""
    drop = _DropTracebacks(package)
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.filters.insert(0, drop)  # before the redaction filter, which would format the traceback
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redact_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_value(item) for item in value]
    return value


def _redacting_annotator() -> type:
    """alpaca_eval's PairwiseAnnotator, with what its judge endpoint answered (the raw completions and what is
    parsed from them) redacted before alpaca_eval caches it (alpaca_eval_cache.json) or returns it (pasta writes
    annotations.json): an endpoint that echoes the key must not get it into a file. The primary keys (instruction
    and the two outputs) are the user's data, and stay as they are."""
    from alpaca_eval.annotators import PairwiseAnnotator

    class RedactingAnnotator(PairwiseAnnotator):
        def _annotate(self, df_to_annotate: pd.DataFrame, **decoding_kwargs: Any) -> pd.DataFrame:
            annotated = super()._annotate(df_to_annotate, **decoding_kwargs)
            for column in annotated.columns.difference(self.primary_keys):
                annotated[column] = annotated[column].map(_redact_value)
            return annotated

    return RedactingAnnotator


def evaluate_outputs(
    model_outputs: list[dict[str, Any]],
    reference_outputs: list[dict[str, Any]],
    *,
    results_dir: Path,
    metric_fn: Callable,
    annotators_config: str | None = None,
    judge: Judge | None = None,
    chunk_size: int = 16,
    judge_settings: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Annotate with an alpaca_eval annotator (annotators_config) or a pasta judge, through `alpaca_eval.evaluate`.

    Returns (metrics, annotations). Verdicts are cached in `results_dir` as they come, so a rerun resumes.
    """
    import alpaca_eval

    results_dir.mkdir(parents=True, exist_ok=True)
    if (annotators_config is None) == (judge is None):
        raise ValueError("give exactly one of annotators_config and judge")
    if judge is not None:
        annotator_kwargs = {
            "Annotator": JudgeAnnotator,
            "judge": judge,
            "pairs_path": results_dir / JUDGE_PAIRS,
            "chunk_size": chunk_size,
            "settings": judge_settings,
        }
        annotators_config = judge.name
    else:
        annotator_kwargs = {"Annotator": _redacting_annotator(), "caching_path": results_dir / ALPACA_EVAL_CACHE}
    try:
        with _without_library_tracebacks("alpaca_eval"):
            leaderboard, annotations = alpaca_eval.evaluate(
                model_outputs=pd.DataFrame(model_outputs),
                reference_outputs=pd.DataFrame(reference_outputs),
                annotators_config=annotators_config,
                output_path=None,  # pasta writes annotations.json and leaderboard.csv itself, atomically
                precomputed_leaderboard=None,
                is_return_instead_of_print=True,
                fn_metric=metric_fn,
                sort_by="win_rate",
                annotation_kwargs={"chunksize": chunk_size} if judge is None else None,
                **annotator_kwargs,
            )
    except Exception as exc:
        # alpaca_eval's annotators re-raise what they cannot retry (a bad key, an endpoint that is down); its
        # message may echo the key, so it goes through the redaction too. An OpenAIError comes from an imported
        # openai: a scoring with pasta's own judges does not pay for importing it.
        openai = sys.modules.get("openai")
        if openai is None or not isinstance(exc, openai.OpenAIError):
            raise
        raise PastaError(
            f"annotator {annotators_config}: {type(exc).__name__}: {error_message(exc)}; verdicts so far are cached "
            f"in {results_dir}: rerun to resume"
        ) from None
    records = pd.DataFrame(annotations).to_dict(orient="records")
    row = leaderboard.iloc[0].to_dict()
    metrics = {key: _plain(value) for key, value in row.items()}
    metrics["annotator"] = str(annotators_config)
    return metrics, records


def rescore_annotations(path: Path, metric_fn: Callable) -> tuple[dict[str, Any], pd.DataFrame]:
    """Metrics of saved annotations, calling no judge; returns (metrics, annotations)."""
    frame = load_annotations(path)
    metrics = metric_fn(frame)
    annotators = sorted(frame["annotator"].astype(str).unique()) if "annotator" in frame.columns else ["unknown"]
    metrics["annotator"] = ",".join(annotators)
    metrics["avg_length"] = int(frame["output_2"].str.len().mean())
    return metrics, frame
