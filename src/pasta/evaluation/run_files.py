"""The files of one evaluated run (one checkpoint, one decode mode) and their checked loading.

An evaluation run directory holds:

    run.json              what was decoded: generator name, model, decode mode, timing mode, device (and its CPU
                          instruction set), eval data
    stats.jsonl           one line per prompt, appended as each finishes (instruction, annotated, output,
                          num_tokens, num_steps, theoretical_speedup, wall_s, prefill_s, decode_s, ...)
    model_outputs.json    AlpacaEval format: [{instruction, output, generator, dataset}], written at the end
    judge_pairs.jsonl     pasta judge preferences, one line per judged pair (resume without re-judging)
    alpaca_eval_cache.json  an alpaca_eval annotator's own cache (same purpose, alpaca_eval's format)
    annotations.json      alpaca_eval annotations (output_1 = reference, output_2 = this run, preference in [1, 2])
    leaderboard.csv       alpaca_eval's one-row leaderboard of this run
    step_costs.json       the decoding model's cost per forward by rows fed (pasta.decoding.cost_model)
    quality.json, speed.json, summary.json, summary.md   the metrics and the per-run summary

Loaders check what a user can get wrong (a file from another model, an outputs file that misses instructions) and
raise one-line PastaErrors that name the file and the problem.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pasta.data import iter_numbered_jsonl, read_json_file
from pasta.decoding.cost_model import StepCosts
from pasta.errors import PastaError

RUN_META = "run.json"
STATS = "stats.jsonl"
MODEL_OUTPUTS = "model_outputs.json"
JUDGE_PAIRS = "judge_pairs.jsonl"
ALPACA_EVAL_CACHE = "alpaca_eval_cache.json"
ANNOTATIONS = "annotations.json"
LEADERBOARD = "leaderboard.csv"
QUALITY = "quality.json"
SPEED = "speed.json"
STEP_COSTS = "step_costs.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"

OUTPUT_FIELDS = ("instruction", "output", "generator")
# The per-prompt numbers that speed metrics are computed from.
STATS_NUMBERS = ("num_tokens", "num_steps", "theoretical_speedup", "wall_s")

def read_json(path: Path, what: str) -> Any:
    """A JSON file, or a PastaError saying which `what` is missing or broken."""
    return read_json_file(path, what)


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    """run.json of an evaluation run directory."""
    if not run_dir.is_dir():
        raise PastaError(f"evaluation run directory not found: {run_dir}")
    return read_json(run_dir / RUN_META, f"run.json of {run_dir} (is it a `python -m pasta.eval` run?)")


def machine(meta: dict[str, Any]) -> str | None:
    """run.json's device, with the CPU's instruction set where the run recorded it ("cpu: AMD EPYC, 2 threads, AVX2")."""
    device, capability = meta.get("device"), meta.get("cpu_capability")
    return f"{device}, {capability}" if device is not None and capability else device


def same_machine(meta: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two runs' wall times compare: one device, and one CPU instruction set where both runs recorded it (an
    older run.json did not; it matches as it did then)."""
    if meta.get("device") != other.get("device"):
        return False
    recorded = "cpu_capability" in meta and "cpu_capability" in other
    return not recorded or meta["cpu_capability"] == other["cpu_capability"]


def read_stats(run_dir: Path) -> list[dict[str, Any]]:
    """Per-prompt stats of a run; a prompt decoded twice (a resumed run) counts once, its last line winning."""
    path = run_dir / STATS
    if not path.is_file():
        raise PastaError(f"per-prompt stats not found: {path} (run generation first: eval.mode=generate)")
    by_instruction: dict[str, dict[str, Any]] = {}
    for line_no, record in iter_numbered_jsonl(path):
        problem = next((f"no '{key}' string" for key in ("instruction", "output")
                        if not isinstance(record.get(key), str)), None)
        problem = problem or next(
            (f"'{key}' is not a number >= 0" for key in STATS_NUMBERS
             if isinstance(record.get(key), bool) or not isinstance(record.get(key), (int, float))
             or not record[key] >= 0),
            None,
        )
        if problem is not None:
            raise PastaError(f"{path}:{line_no}: {problem}; is this a `python -m pasta.eval` stats file?")
        by_instruction[record["instruction"]] = record
    return list(by_instruction.values())


def outputs_path(path: Path) -> Path:
    """A model_outputs.json given directly or as the run directory holding it."""
    return path / MODEL_OUTPUTS if path.is_dir() else path


def load_model_outputs(path: Path, expected_generator: str | None = None) -> list[dict[str, Any]]:
    """AlpacaEval-format outputs: a JSON list of {instruction, output, generator, ...}, one generator throughout.

    `expected_generator`: the name this file must carry (e.g. the generator recorded in its run's run.json);
    a file of another model is an error naming both.
    """
    path = outputs_path(path)
    records = read_json(path, "model outputs file")
    if not isinstance(records, list) or not records:
        raise PastaError(f"{path}: expected a non-empty JSON list of {{instruction, output, generator}} records")
    for index, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise PastaError(f"{path}: record {index} is not a JSON object")
        missing = [key for key in OUTPUT_FIELDS if not isinstance(record.get(key), str)]
        if missing:
            raise PastaError(f"{path}: record {index} lacks the string field(s) {', '.join(missing)}")
    generators = sorted({record["generator"] for record in records})
    if len(generators) > 1:
        raise PastaError(f"{path}: outputs of several models in one file ({', '.join(generators)}); keep one")
    if expected_generator is not None and generators[0] != expected_generator:
        raise PastaError(
            f"{path}: outputs of {generators[0]!r}, but this run is {expected_generator!r}: wrong file?"
        )
    check_unique_instructions(records, str(path))
    return records


def check_unique_instructions(records: Iterable[dict[str, Any]], what: str) -> None:
    """Raise PastaError if two records of `what` share an instruction: their outputs and verdicts would collide."""
    seen: set[str] = set()
    for index, record in enumerate(records, start=1):
        if record["instruction"] in seen:
            raise PastaError(f"{what}: record {index}: instruction given twice: {record['instruction'][:80]!r}")
        seen.add(record["instruction"])


def check_covers(records: Iterable[dict[str, Any]], instructions: Iterable[str], what: str) -> None:
    """Raise PastaError if `records` (of `what`, e.g. a file path) lack any of `instructions`, naming the first."""
    have = {record["instruction"] for record in records}
    wanted = list(instructions)
    missing = [instruction for instruction in wanted if instruction not in have]
    if missing:
        raise PastaError(
            f"{what} lacks {len(missing)} of the {len(wanted)} evaluated instructions "
            f"(first: {missing[0][:80]!r})"
        )


def check_known(records: Iterable[dict[str, Any]], instructions: Iterable[str], what: str) -> None:
    """Raise PastaError if `records` hold instructions outside the evaluation set, naming the first."""
    known = set(instructions)
    unknown = [record["instruction"] for record in records if record["instruction"] not in known]
    if unknown:
        raise PastaError(
            f"{what} holds {len(unknown)} instructions that are not in the evaluation set "
            f"(first: {unknown[0][:80]!r}); was it decoded from another eval_data?"
        )


def read_step_costs(run_dir: Path) -> StepCosts | None:
    """The run's measured cost per forward by rows (step_costs.json), or None when it has none."""
    path = run_dir / STEP_COSTS
    if not path.is_file():
        return None
    record = read_json(path, f"{STEP_COSTS} of {run_dir}")
    try:
        return StepCosts.from_dict(record)
    except (TypeError, KeyError) as exc:
        raise PastaError(f"{path}: not a step-costs record ({exc})") from None
