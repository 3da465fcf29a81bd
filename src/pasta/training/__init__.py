"""Training: stage 1 (SFT on the PASTA-LANG layout) and stage 2 (preference rounds with BoNBoN), on TRL.

    from pasta.training import run_sft, run_pref     # plain functions over a composed `train` config
    run_sft(pasta.config.compose("train", ["stage=sft", "output_dir=/tmp/run"]))

Uses the language (`pasta.lang`), models, data, the decoder and the judges; never the evaluation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pasta.lazy import lazy_exports
from pasta.training.config import LoraSettings, OptimSettings, PrefSettings, SFTSettings, settings_from_cfg

# The rest (collators, examples, the SFT run) needs torch and transformers: imported on first use, so that a command's
# config check, which reads the stage settings, does not import them (pasta.lazy).
__getattr__ = lazy_exports(__name__, {
    "pasta.training.collator": ("LayoutCollator", "PairCollator"),
    "pasta.training.examples": ("ExampleStats", "build_sft_examples"),
    "pasta.training.sft": ("run_sft",),
}, globals())

if TYPE_CHECKING:
    from pasta.training.collator import LayoutCollator, PairCollator
    from pasta.training.examples import ExampleStats, build_sft_examples
    from pasta.training.sft import run_sft

__all__ = [
    "ExampleStats",
    "LayoutCollator",
    "LoraSettings",
    "OptimSettings",
    "PairCollator",
    "PrefSettings",
    "SFTSettings",
    "build_sft_examples",
    "run_sft",
    "settings_from_cfg",
]
