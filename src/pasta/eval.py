"""`python -m pasta.eval`: decode the AlpacaEval prompts with a checkpoint, score quality and speed, gather reports.

    python -m pasta.eval model.path=outputs/sft decode=async eval.limit=20            # generate, then score
    python -m pasta.eval model.path=outputs/base decode=sequential eval.mode=generate
    python -m pasta.eval eval.mode=score output_dir=outputs/eval/sft-async \
        eval.reference=outputs/eval/base-sequential eval.sequential=outputs/eval/base-sequential
    python -m pasta.eval eval_data=alpaca_eval eval.annotations=PATH/annotations.json output_dir=outputs/rescored
    python -m pasta.eval report='outputs/eval/*'                                       # table + Pareto plot
    accelerate launch --config_file conf/accelerate/ddp.yaml -m pasta.eval model.path=...  # prompts sharded

Modes (eval.mode): auto (report when `report` is set, score when eval.annotations is set, else generate then
score) | generate | score | all | report. The work is done by plain functions in pasta.evaluation; `evaluate(cfg)`
(pasta.evaluation.dispatch) picks them, and tests call it with `pasta.config.compose("eval", overrides=[...])`.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from pasta.cli import run_entry
from pasta.evaluation import dispatch


# A function of this module, not dispatch.evaluate itself: Hydra names the job (and so the run folder) after the
# file of the function it wraps.
def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run what the config asks for; returns {"mode", "output_dir", and "summary" or "report"}."""
    return dispatch.evaluate(cfg)


cli = run_entry(evaluate, "eval", uses_torch=dispatch.uses_torch)

if __name__ == "__main__":
    cli()
