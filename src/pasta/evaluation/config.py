"""The typed view of the `eval:` config node (conf/eval/default.yaml) of `python -m pasta.eval`.

`schema_from(cfg.eval, EvalConfig, "eval")` (pasta.config) checks the composed node against these dataclasses, so
a misspelt key or a wrong type stops with one line instead of being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pasta.choice import Choice
from pasta.config import check_ranges
from pasta.evaluation.speed import BootstrapConfig


class EvalMode(Choice):
    auto = "auto"
    generate = "generate"
    score = "score"
    all = "all"
    report = "report"


class Timing(Choice):
    wall = "wall"
    throughput = "throughput"


@dataclass
class SotConfig:
    """Skeleton-of-Thought prompting (decode=sot): an outline request, then one request per point, batched.

    The prompts (conf/eval/default.yaml) are Ning et al. 2023's (arXiv 2307.15337), adapted to chat models; the
    requests sample as the `decode` node says.
    """

    outline_prompt: str = field(
        metadata={"help": "outline request; {instruction} is the user's request; the reply is a numbered list"}
    )
    point_prompt: str = field(
        metadata={"help": "one point's expansion; fields {instruction}, {outline} (the numbered skeleton), {index} "
                          "and {point} (the point to expand)"}
    )
    max_points: int = field(default=6, metadata={"help": "most outline points expanded; extra points are dropped"})
    outline_max_new_tokens: int = field(default=160, metadata={"help": "token limit of the outline request"})
    point_max_new_tokens: int = field(default=128, metadata={"help": "token limit of each point's expansion"})


@dataclass
class EvalConfig:
    """What `python -m pasta.eval` does, and how (the `eval:` node, conf/eval/default.yaml)."""

    mode: EvalMode = field(
        default=EvalMode.auto,
        metadata={"help": "auto (report if `report` is set, score if eval.annotations is set, else generate then "
                          "score) | generate | score | all | report"},
    )
    generator: str | None = field(
        default=None, metadata={"help": "name of this run's outputs; null = <checkpoint or model name>-<decode>"}
    )
    limit: int | None = field(
        default=None, metadata={"help": "decode only the first N prompts (of the subset, when one is set); null = all"}
    )
    subset: int | None = field(
        default=None,
        metadata={"help": "a seeded sample of N of eval_data's prompts (kept in data-set order), the same whatever "
                          "the model or decode mode; a larger N with the same seed holds the smaller sample. "
                          "Recorded in run.json: a run is not resumed, nor scored, with another subset. null = all"},
    )
    subset_seed: int = field(default=0, metadata={"help": "seed of eval.subset"})
    timing: Timing = field(
        default=Timing.wall,
        metadata={"help": "wall: one request at a time after a warm-up (per-prompt latency, the paper's setting) "
                          "| throughput: batch_size prompts at once, continuously batched (faster for quality-only runs; "
                          "no per-prompt speedups)"},
    )
    batch_size: int = field(default=8, metadata={"help": "prompts decoded at once in timing=throughput (the next joins as one ends)"})
    timed_prompts: int = field(
        default=0,
        metadata={"help": "timing=throughput: decode the first N prompts one at a time (after the warm-up), so "
                          "that per-prompt wall-clock speedups exist for them, then batch the rest; 0 = none"},
    )
    parallelism: bool = field(
        default=True,
        metadata={"help": "decode=async: replay each forked answer timed alone as plain text (its own tokens without "
                          "tags, teacher-forced, one per step, the same model, right after it) and time that too: "
                          "the async over sequential wall clock of the same answer, the speedup that is parallelism "
                          "and not a shorter answer (speed.json parallelism_*; an answer that forked nothing is its "
                          "own plain decode and counts 1.0)"},
    )
    warmup_prompts: int = field(
        default=1,
        metadata={"help": "prompts decoded (and discarded) before timing: allocations, kernel selection, torch.compile"},
    )
    outputs: str | None = field(
        default=None, metadata={"help": "score this AlpacaEval outputs file; null = output_dir/model_outputs.json"}
    )
    reference: str | None = field(
        default=None,
        metadata={"help": "reference answers: a run dir or model_outputs.json (Baseline-SFT); null = eval_data's "
                          "own outputs (GPT-4 Turbo for AlpacaEval)"},
    )
    sequential: str | None = field(
        default=None,
        metadata={"help": "a sequential run dir (Baseline-SFT, decode=sequential, timing=wall) to measure wall-clock "
                          "speedups against; null = none"},
    )
    sequential_model: str | None = field(
        default=None,
        metadata={"help": "Baseline-SFT's model folder: every prompt decoded one at a time is decoded by it too, "
                          "sequentially, right after the run's own answer, and the wall-clock speedup compares "
                          "those two times (side by side in one run: a machine that runs faster or slower over "
                          "hours moves both); its answers must be eval.sequential's, which still gives the steps, "
                          "lengths and cost model; null = eval.sequential's own times"},
    )
    annotators_config: str | None = field(
        default=None,
        metadata={"help": "alpaca_eval annotator config, a name or a path (weighted_alpaca_eval_gpt4_turbo for real "
                          "runs: needs OPENAI_API_KEY or an OpenAI-compatible endpoint returning logprobs); null = "
                          "the pasta judge of the judge/ group"},
    )
    win_rate: bool = field(
        default=True,
        metadata={"help": "judge the outputs against the reference for a win rate; false = the offline proxies only "
                          "(for offline runs where no judge is trustworthy: scripts/judge_validity.py)"},
    )
    annotations: str | None = field(
        default=None, metadata={"help": "re-score these alpaca_eval annotations.json; calls no judge"}
    )
    length_controlled: str = field(
        default="auto",
        metadata={"help": "length-controlled win rate: auto (official when df_gamed.csv can be downloaded, else "
                          "none) | official | offline (an estimate NOT comparable with the leaderboard) | off "
                          "(pasta.evaluation.quality)"},
    )
    judge_chunk_size: int = field(
        default=16, metadata={"help": "pairs judged between two saves of the verdicts (what a failed judge loses at most)"}
    )
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig, metadata={"help": "confidence intervals"})
    sot: SotConfig = field(
        default_factory=lambda: SotConfig(outline_prompt="???", point_prompt="???"),
        metadata={"help": "Skeleton-of-Thought settings (prompts in conf/eval/default.yaml)"},
    )

    def validate(self, where: str) -> None:
        # All before decoding: the bootstrap and the judge run on the answers at the end.
        check_ranges(self, where, {
            "limit": (lambda v: v is None or v >= 1, ">= 1 or null"),
            "subset": (lambda v: v is None or v >= 1, ">= 1 or null"),
            "batch_size": (lambda v: v >= 1, ">= 1"),
            "judge_chunk_size": (lambda v: v >= 1, ">= 1"),
            "warmup_prompts": (lambda v: v >= 0, ">= 0"),
            "timed_prompts": (lambda v: v >= 0, ">= 0"),
            "bootstrap.num_resamples": (lambda v: v >= 1, ">= 1"),
            "bootstrap.confidence": (lambda v: 0 < v < 1, "in (0, 1)"),
            "bootstrap.seed": (lambda v: v >= 0, ">= 0"),  # numpy's default_rng refuses a negative seed
            "sot.max_points": (lambda v: v >= 1, ">= 1"),
            "sot.outline_max_new_tokens": (lambda v: v >= 1, ">= 1"),
            "sot.point_max_new_tokens": (lambda v: v >= 1, ">= 1"),
        })
