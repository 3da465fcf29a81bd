"""Training entry point: `python -m pasta.train stage=sft|pref [overrides...]` (console script `pasta-train`).

    python -m pasta.train stage=sft data.path=annotated.jsonl output_dir=outputs/sft           # PASTA-SFT
    python -m pasta.train stage=sft data.path=annotated.jsonl data.strip_annotations=true \\
        output_dir=outputs/baseline-sft                                                     # Baseline-SFT
    python -m pasta.train stage=sft output_dir=outputs/sft resume=true                      # continue a killed run
    python -m pasta.train stage=pref model.path=outputs/sft/final output_dir=outputs/pref   # preference rounds
    python -m pasta.train -m stage=pref model.path=outputs/sft/final stage.quality_weight=1,2,4,8,inf

Multi-process: `accelerate launch --config_file conf/accelerate/ddp.yaml -m pasta.train stage=sft ...`.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from pasta.cli import run_entry
from pasta.errors import PastaError


def train(cfg: DictConfig) -> Path:
    """Run the stage `cfg.stage.kind` names; returns its final model folder."""
    kind = cfg.stage.get("kind")
    if kind == "sft":
        from pasta.training.sft import run_sft

        return run_sft(cfg)
    if kind == "pref":
        from pasta.training.pref import run_pref

        return run_pref(cfg)
    raise PastaError(f"unknown stage {kind!r}: use stage=sft or stage=pref")


main = run_entry(train, "train")
cli = main

if __name__ == "__main__":
    main()
