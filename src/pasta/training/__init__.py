"""Training: stage 1 (SFT on the PASTA-LANG layout) and stage 2 (preference rounds with BoNBoN), on TRL.

    from pasta.training import run_sft, run_pref     # plain functions over a composed `train` config
    run_sft(pasta.config.compose("train", ["stage=sft", "output_dir=/tmp/run"]))

Uses the language (`pasta.lang`), models, data, the decoder and the judges; never the evaluation.
"""

from pasta.training.collator import LayoutCollator, PairCollator
from pasta.training.config import LoraSettings, OptimSettings, PrefSettings, SFTSettings, settings_from_cfg
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
