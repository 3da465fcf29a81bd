"""`python -m pasta.annotate`: a teacher adds PASTA-LANG tags to instruction data, validated and measured, durably.

    python -m pasta.annotate                                         # structural teacher on the embedded sample
    python -m pasta.annotate data=alpaca_5k                          # the shared 5K Alpaca set
    python -m pasta.annotate teacher=hf data.limit=10                # the embedded SmolLM2 as teacher, offline
    python -m pasta.annotate teacher=openai teacher.model=gpt-4o-mini data=alpaca_5k output=out/a5k.jsonl
    python -m pasta.annotate data.path=my.jsonl data.limit=100 on_reject=keep_unannotated
    accelerate launch --config_file conf/accelerate/ddp.yaml -m pasta.annotate teacher=hf ...   # records sharded

What it writes, how it resumes and validates: pasta.annotation.stage; tests call `annotate(compose("annotate"))`.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from pasta.annotation.config import AnnotateConfig, companion_paths
from pasta.cli import run_entry

__all__ = ["AnnotateConfig", "annotate", "companion_paths", "cli"]


# A function of this module, not the stage's own: Hydra names the job (and so the run folder, runs/annotate/)
# after the file of the function it wraps.
def annotate(cfg: DictConfig) -> dict[str, Any]:
    """Annotate `cfg.data` with `cfg.teacher` into `cfg.output` (resuming); returns the summary it writes."""
    from pasta.annotation import stage  # here: the command line is checked first, without the stage's torch

    return stage.annotate(cfg)


cli = run_entry(annotate, "annotate")

if __name__ == "__main__":
    cli()
