"""What `python -m pasta.eval` does with a composed config: pick the mode, the output folder, and run it.

Modes (eval.mode): auto (report when `report` is set, score when eval.annotations is set, else generate then
score) | generate | score | all | report. Under `accelerate launch` every process decodes its share of the prompts
and the main process scores (pasta.parallel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from pasta.config import schema_from
from pasta.data import check_output_dir
from pasta.errors import PastaError
from pasta.evaluation.config import EvalConfig, EvalMode
from pasta.parallel import current_processes


def _report_patterns(report: Any) -> list[str]:
    if isinstance(report, (list, tuple, ListConfig)):
        return [str(p) for p in report]
    return [str(report)]


def run_name(cfg: DictConfig, ecfg: EvalConfig) -> str:
    """This run's generator name: eval.generator, else <checkpoint folder or model name>-<decode>."""
    if ecfg.generator:
        return ecfg.generator
    model = Path(str(cfg.model.path)).name if cfg.model.get("path") else cfg.model.name
    return f"{model}-{cfg.decode.kind}"


def resolve_mode(cfg: DictConfig, ecfg: EvalConfig) -> EvalMode:
    if ecfg.mode != EvalMode.auto:
        if ecfg.mode == EvalMode.report and not cfg.get("report"):
            raise PastaError("eval.mode=report needs report=[run_dir,...] (paths or globs)")
        return EvalMode(ecfg.mode)
    if cfg.get("report"):
        return EvalMode.report
    return EvalMode.score if ecfg.annotations is not None else EvalMode.all


def uses_torch(cfg: DictConfig) -> bool:
    """Whether the run decodes or scores (torch), or only gathers a report of saved runs (no torch)."""
    return resolve_mode(cfg, schema_from(cfg.eval, EvalConfig, "eval")) != EvalMode.report


def output_dir(cfg: DictConfig, ecfg: EvalConfig, mode: EvalMode) -> Path:
    """`output_dir`, else <paths.output_root>/eval/<run name> (or /eval/report for a report)."""
    if cfg.get("output_dir"):
        return Path(str(cfg.output_dir))
    root = Path(str(cfg.paths.output_root)) / "eval"
    if mode == EvalMode.report:
        return root / "report"
    if ecfg.annotations is not None:
        from pasta.evaluation.quality import load_annotations

        return root / str(load_annotations(Path(ecfg.annotations))["generator_2"].iloc[0])
    return root / run_name(cfg, ecfg)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run what the config asks for; returns {"mode", "output_dir", and "summary" or "report"}."""
    ecfg = schema_from(cfg.eval, EvalConfig, "eval")
    mode = resolve_mode(cfg, ecfg)
    judged = ecfg.win_rate and ecfg.annotators_config is None and ecfg.annotations is None  # by cfg.judge
    if judged and mode in (EvalMode.score, EvalMode.all) and cfg.judge.get("kind") == "embedding":
        # before decoding: the judge is built after it
        raise PastaError("judge=embedding only measures similarity and cannot judge a win rate: use judge=hf or "
                         "judge=openai, or eval.win_rate=false for the offline proxies")
    out_dir = check_output_dir(output_dir(cfg, ecfg, mode), "output_dir")
    result: dict[str, Any] = {"mode": mode, "output_dir": str(out_dir)}
    processes = current_processes()
    if mode == EvalMode.report:
        if not processes.is_main:
            return result
        from pasta.evaluation.report import gather

        report = gather(_report_patterns(cfg.report), out_dir)
        print(report["markdown"], end="")
        print(f"report: {out_dir}")
        result["report"] = report
        return result
    if mode in (EvalMode.generate, EvalMode.all):
        from pasta.evaluation.generation import generate_run

        generate_run(cfg, ecfg, out_dir, run_name(cfg, ecfg), processes)
    if not processes.is_main:
        return result  # under `accelerate launch` the others decode their share; the main process scores
    if mode in (EvalMode.score, EvalMode.all):
        from pasta.evaluation.formatting import run_markdown
        from pasta.evaluation.scoring import score_run

        summary = score_run(cfg, ecfg, out_dir)
        print(run_markdown(summary), end="")
        print(f"results: {out_dir}")
        result["summary"] = summary
    return result
