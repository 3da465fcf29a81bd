"""Typed views of the `stage:` configs (conf/stage/sft.yaml, conf/stage/pref.yaml), and their defaults.

`settings_from_cfg(cfg.stage)` checks the composed node against SFTSettings or PrefSettings (by `stage.kind`), so a
misspelt key or a wrong type stops with one line instead of being ignored.

A training setting that TRL's config (SFTConfig for sft, DPOConfig for pref) also has carries TRL's own name and
passes straight through to it, as trl/scripts pass their dataclasses (but for max_length, which pasta's collators
apply); the other settings are pasta's own (finetune, lora, too_long, mixed_precision, the preference rounds'
sampling and scoring, ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pasta.choice import Choice
from pasta.config import check_ranges, schema_from
from pasta.errors import PastaError


def mixed_precision_flags(setting: MixedPrecision, device: str) -> dict[str, bool]:
    """TrainingArguments' bf16/fp16 from `stage.mixed_precision`."""
    import torch

    if setting == MixedPrecision.auto:
        cuda_bf16 = device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        setting = MixedPrecision.bf16 if cuda_bf16 or (device == "cpu" and cpu_has_bf16()) else MixedPrecision.no
    return {"bf16": setting == MixedPrecision.bf16, "fp16": setting == MixedPrecision.fp16}


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX). There bf16 autocast trains faster than
    float32 (docs/stages/train-sft.md); without them torch emulates bf16, slower than float32."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private, so looked up, absent = False
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


@dataclass
class LoraSettings:
    """Low-rank adapters (peft) on the linear layers; the PASTA-LANG tag-token rows are trained as well."""

    r: int = field(default=16, metadata={"help": "adapter rank"})
    alpha: int = field(default=32, metadata={"help": "adapter scaling numerator (scale = alpha / r)"})
    # 0 rather than peft's usual 0.05: on a CPU the dropout masks are a large share of a step
    # (docs/stages/train-sft.md#speed-on-a-cpu), and the study's student trained without them forked as often.
    dropout: float = field(default=0.0, metadata={"help": "dropout on the adapter input"})
    target_modules: Any = field(
        default="all-linear", metadata={"help": "peft target_modules: all-linear, or a list of module names"}
    )


class Finetune(Choice):
    lora = "lora"
    full = "full"


class TooLong(Choice):
    truncate = "truncate"
    skip = "skip"


class MixedPrecision(Choice):
    auto = "auto"
    no = "no"
    bf16 = "bf16"
    fp16 = "fp16"


class Reference(Choice):
    output = "output"
    baseline = "baseline"


class SpeedReward(Choice):
    """How a candidate's speed is scored (pasta.training.pairs.speed_score)."""

    latency = "latency"  # reference answer's tokens / the candidate's decoding steps: a longer answer is slower
    theoretical = "theoretical"  # the candidate's own tokens / steps: the paper's, which a longer answer can raise
    # min(the candidate's tokens, the reference's) / its steps: latency without credit for an answer shorter than the
    # reference, so a candidate wins on speed by forking, not by saying less
    latency_capped = "latency_capped"

    @property
    def needs_reference(self) -> bool:
        return self != SpeedReward.theoretical


class RejectedSide(Choice):
    """What a prompt's chosen candidate is paired against (pasta.training.pairs)."""

    worst = "worst"  # the prompt's worst candidate: the paper's best-vs-worst
    # the chosen answer's own words without their tags, as a sequential answer: a pair that differs only in how the
    # answer is decoded, where it forks, never in what it says or its length
    untagged = "untagged"
    both = "both"  # each prompt's two pairs: untagged for the structure, worst for what the answer says


@dataclass
class OptimSettings:
    """The optimisation loop shared by both stages (transformers TrainingArguments underneath)."""

    finetune: Finetune = field(
        default=Finetune.lora,
        metadata={"help": "lora (adapters on every linear layer + trainable tag-token rows) or full (every weight, "
                          "the paper's setting)"},
    )
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"help": "used when finetune=lora"})
    merge_lora: bool = field(
        default=True,
        metadata={"help": "LoRA only: final/ holds the merged model; false = final/ holds the adapter over "
                          "<output_dir>/base (both load)"},
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "passes over the training examples"})
    max_steps: int = field(
        default=-1, metadata={"help": "stop after this many optimizer steps; -1 = num_train_epochs"}
    )
    per_device_train_batch_size: int = field(default=8, metadata={"help": "examples per device per micro-batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    learning_rate: float = field(default=2e-4, metadata={"help": "peak learning rate"})
    lr_scheduler_type: str = field(
        default="linear", metadata={"help": "transformers scheduler name (linear decays to 0)"}
    )
    # Not TRL's name: transformers 5 dropped warmup_ratio for a warmup_steps that reads a value below 1 as this
    # fraction; pasta keeps the fraction (and its [0, 1) check) under the name that says what it is.
    warmup_ratio: float = field(default=0.0, metadata={"help": "fraction of steps with linear warm-up"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping"})
    max_length: int = field(
        default=1024,
        metadata={"help": "rows of one training layout (prompt + main thread + every chunk); longer ones are "
                          "truncated or skipped (too_long), counted"},
    )
    too_long: TooLong = field(
        default=TooLong.truncate,
        metadata={"help": "longer examples: truncate (keep the first max_length rows) or skip; both counted"},
    )
    mixed_precision: MixedPrecision = field(
        default=MixedPrecision.auto,
        metadata={"help": "auto (bf16 on a bf16-capable GPU or on a CPU with bf16 instructions, AVX512-BF16 or AMX; "
                          "else none), no, bf16 or fp16"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in the backward pass: less memory, about a third more compute"}
    )
    save_steps: int = field(
        default=50, metadata={"help": "checkpoint every this many optimizer steps, under <output_dir>/checkpoints"}
    )
    save_total_limit: int = field(default=2, metadata={"help": "checkpoints kept (the newest)"})
    logging_steps: int = field(default=10, metadata={"help": "log loss and metrics every this many steps"})
    report_to: str = field(
        default="none", metadata={"help": "transformers report_to: none, tensorboard, wandb"}
    )
    group_by_length: bool = field(
        default=False,
        metadata={"help": "batch examples of similar length (transformers' LengthGroupedSampler): less padding"},
    )

    def check_library_names(self, where: str) -> None:
        """Refuse a scheduler or reporter transformers does not know, which it refuses only after the model loads.
        Apart from `validate`: it imports transformers, which checking a command line does not."""
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
        from transformers.trainer_utils import SchedulerType

        schedulers = [scheduler.value for scheduler in SchedulerType]
        if self.lr_scheduler_type not in schedulers:
            raise PastaError(f"{where}.lr_scheduler_type={self.lr_scheduler_type!r} is not one of "
                             f"{', '.join(schedulers)}")
        reporters = ["none", "all", *INTEGRATION_TO_CALLBACK]
        if self.report_to not in reporters:
            raise PastaError(f"{where}.report_to={self.report_to!r} is not one of {', '.join(reporters)}")

    def trl_config(self) -> type:
        """TRL's config class of this stage's trainer (SFTConfig, DPOConfig)."""
        raise NotImplementedError(f"{type(self).__name__} names no TRL config")

    def trl_fields(self) -> dict[str, Any]:
        """The settings whose names TRL's config also has, by name. transformers renamed `gradient_checkpointing` to
        `activation_checkpointing` (the old name warns until v6): where TRL's config has the new name, it gets it."""
        trl_names = {f.name for f in dataclasses.fields(self.trl_config())}
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in trl_names}
        if "activation_checkpointing" in trl_names and "gradient_checkpointing" in fields:
            fields["activation_checkpointing"] = fields.pop("gradient_checkpointing")
        return fields

    def trainer_kwargs(self, checkpoint_dir: Path, cfg: DictConfig) -> dict[str, Any]:
        """Keyword arguments of TRL's config: `trl_fields()` plus what pasta decides itself. CPU-safe: TRL itself
        defaults to bf16 and gradient checkpointing, which a CPU cannot use or does not need."""
        from pasta.config import resolve_device

        device = resolve_device(cfg.get("device", "auto"))
        return {
            **self.trl_fields(),
            "output_dir": str(checkpoint_dir),
            # The collators build each layout's first max_length rows (what is cut was counted); TRL cutting the
            # token ids as well would break the layouts.
            "max_length": None,
            "warmup_steps": self.warmup_ratio,  # transformers reads a value below 1 as a fraction of the steps
            **mixed_precision_flags(self.mixed_precision, device),
            "use_cpu": device == "cpu",
            "save_strategy": "steps",
            "seed": int(cfg.get("seed") or 0),
            "remove_unused_columns": False,  # the collators need every column of our examples
            "dataloader_num_workers": 0,
            # transformers' LengthGroupedSampler reads the dataset's `length` column (rows of each layout)
            **({"train_sampling_strategy": "group_by_length"} if self.group_by_length else {}),
        }

    def validate(self, where: str) -> None:
        """Refuse what transformers, PEFT or torch would refuse only after the model loads (a traceback), and what
        they would accept and train wrongly (0 epochs: an untrained final/; max_steps=0: a whole epoch). The names
        only transformers knows are `check_library_names`'."""
        check_ranges(self, where, {
            "warmup_ratio": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
            "per_device_train_batch_size": (lambda v: v >= 1, ">= 1"),
            "gradient_accumulation_steps": (lambda v: v >= 1, ">= 1"),
            "max_length": (lambda v: v >= 2, ">= 2"),
            "num_train_epochs": (lambda v: v > 0, "> 0"),
            "max_steps": (lambda v: v == -1 or v >= 1, ">= 1, or -1 for num_train_epochs"),
            "learning_rate": (lambda v: v > 0, "> 0"),
            "weight_decay": (lambda v: v >= 0, ">= 0"),
            "max_grad_norm": (lambda v: v >= 0, ">= 0"),
            "logging_steps": (lambda v: v >= 1, ">= 1"),
            "save_steps": (lambda v: v >= 1, ">= 1"),
            "save_total_limit": (lambda v: v >= 1, ">= 1"),
            "lora.r": (lambda v: v >= 1, ">= 1"),
            "lora.alpha": (lambda v: v > 0, "> 0"),
            "lora.dropout": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
        })


@dataclass
class SFTSettings(OptimSettings):
    """Stage 1: supervised finetuning on annotated responses in the PASTA-LANG training layout.

    Input: data.path=<annotated JSONL from pasta.annotate>; data.strip_annotations=true trains Baseline-SFT on the
    same records without tags. CPU-friendly defaults: LoRA, fp32.
    """

    kind: str = field(default="sft", metadata={"help": "the stage: sft"})
    # 2 x 4 rather than 8 x 1: the same optimizer steps (transformers normalises the loss over the accumulated
    # tokens) for a quarter of the activations at once (docs/stages/train-sft.md has the measured peaks).
    per_device_train_batch_size: int = field(default=2, metadata={"help": "examples per device per micro-batch"})
    gradient_accumulation_steps: int = field(default=4, metadata={"help": "micro-batches per optimizer step"})
    # LoRA at 1e-3: a lower rate left the stage-default student not forking at all after its steps
    # (docs/results/experiments.md#how-the-sft-default-was-chosen); full finetuning wants a far lower one
    # (experiment=paper_sft).
    learning_rate: float = field(default=1e-3, metadata={"help": "peak learning rate (LoRA; full finetuning: ~1e-5)"})
    group_by_length: bool = field(
        default=True,
        metadata={"help": "batch examples of similar length (transformers' LengthGroupedSampler): little padding, "
                          "so whole examples stay affordable"},
    )

    def trl_config(self) -> type:
        from trl import SFTConfig

        return SFTConfig


@dataclass
class PrefSettings(OptimSettings):
    """Stage 2: rounds of sampling, scoring, best-vs-worst pairing and BoNBoN training.

    Each round samples num_samples candidates per prompt with the asynchronous decoder, scores them by speed
    (speed_reward) + quality_weight * quality (the judge group), pairs best vs worst per prompt and trains
    on the pairs with BoNBoN (alpha * SFT(best) + (1 - alpha) * IPO) through TRL's DPOTrainer, the reference model
    being the policy at the round's start; the next round starts from the result.
    """

    kind: str = field(default="pref", metadata={"help": "the stage: pref"})
    # A round starts from a trained policy and reweights its own samples: smaller batches and a tenth of SFT's
    # learning rate. Two passes over few pairs, because one did not move the policy: at 16 pairs and one epoch the
    # SmolLM2-135M LoRA student ended its rounds at IPO margins of 0.025 and 0.005, at 32 pairs and two epochs at
    # 0.68 and 0.72, with the held-out speedup rising (docs/results/experiments.md, "Bigger rounds").
    per_device_train_batch_size: int = field(
        default=4, metadata={"help": "pairs per device per micro-batch (each pair is two layouts)"}
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "peak learning rate"})
    num_train_epochs: float = field(default=2.0, metadata={"help": "passes over each round's pairs"})
    logging_steps: int = field(default=5, metadata={"help": "log loss and margins every this many steps"})
    rounds: int = field(
        default=1, metadata={"help": "preference rounds; each starts from the previous round"}
    )
    prompts_per_round: int | None = field(
        default=32,
        metadata={"help": "prompts sampled per round (a window that moves on each round); null = all"},
    )
    num_samples: int = field(default=4, metadata={"help": "candidates sampled per prompt (the paper: 10)"})
    quality_weight: float = field(
        default=1.0,
        metadata={"help": "the paper's lambda: score = speed + lambda * quality; inf = quality only"},
    )
    speed_reward: SpeedReward = field(
        default=SpeedReward.latency_capped,
        metadata={"help": "latency: the reference answer's tokens (what a sequential decode of it takes in steps) "
                          "over the candidate's decoding steps, the unit the evaluation's wall-clock speedup "
                          "measures | theoretical: the candidate's own tokens over its steps (the paper's; a longer "
                          "answer with more chunks raises it) | latency_capped: the smaller of the two, i.e. "
                          "min(candidate's tokens, reference's tokens) over the candidate's steps: no credit for an "
                          "answer shorter than the reference"},
    )
    pair_length_tolerance: float | None = field(
        default=None,
        metadata={"help": "the rejected side is the worst candidate whose answer text is within this fraction of the "
                          "chosen one's length (0.15: +-15% of its characters), so a pair differs in speed and "
                          "quality at equal length and cannot teach brevity; a prompt with none is skipped "
                          "(metrics.json's skipped.no_length_match); null = the worst of all candidates (the "
                          "paper's)"},
    )
    quality_floor: bool = field(
        default=False,
        metadata={"help": "a chosen side is never a candidate the judge scores below its prompt's median candidate "
                          "(the rule forking.jsonl follows), and the rejected side of best vs worst never one it scores "
                          "above the chosen (a malformed one aside); a prompt left without a pair is counted in "
                          "metrics.json's skipped.fork_below_quality_floor or skipped.below_quality_floor; false = "
                          "the paper's pairing"},
    )
    chosen_must_end: bool = field(
        default=False,
        metadata={"help": "a chosen side is always an answer that ended by itself, never one its budget cut: a cut "
                          "answer ranks as a malformed one does (the rejected side first); a prompt whose well-formed "
                          "candidates were all cut makes no pair, metrics.json's skipped.all_cut (skipped.fork_cut "
                          "for the untagged pair); metrics.json counts the cut sides, chosen_num_cut and "
                          "rejected_num_cut; false = the paper's pairing"},
    )
    rejected_side: RejectedSide = field(
        default=RejectedSide.worst,
        metadata={"help": "what each prompt's chosen answer is paired against: worst (its worst candidate, the "
                          "paper's) | untagged (the best forked well-formed candidate against its own words "
                          "without tags, decoded sequentially: the pair differs only where the answer forks; a "
                          "prompt with no such candidate is skipped, metrics.json's skipped.no_fork, and so is one "
                          "whose fork scores no better than its words untagged, skipped.fork_not_better: always at "
                          "quality_weight=inf) | both (each prompt gives both pairs: the untagged one, and best vs "
                          "worst, within pair_length_tolerance when set)"},
    )
    alpha: float = field(
        default=0.5, metadata={"help": "BoNBoN: alpha * SFT(best) + (1 - alpha) * IPO(margin)"}
    )
    beta: float = field(
        default=0.1, metadata={"help": "IPO regularisation (TRL's beta; target margin 1/(2 beta))"}
    )
    precompute_ref_log_probs: bool = field(
        default=True,
        metadata={"help": "score every pair under the reference model (the round's starting policy) once, when the "
                          "round's training starts, rather than on every step of every epoch: the same losses for "
                          "less compute; false = a reference forward on each step"},
    )
    reference: Reference = field(
        default=Reference.output,
        metadata={
            "help": "quality reference: output (the record's answer) or baseline (decode stage.baseline_model)"
        },
    )
    speed_reference: Reference | None = field(
        default=None,
        metadata={
            "help": "the answer whose tokens the latency speed rewards count a candidate's steps against: output or "
                    "baseline; null = stage.reference. reference=output speed_reference=baseline judges a candidate "
                    "against the record's answer and times it against what Baseline-SFT's answer takes"
        },
    )
    baseline_model: str | None = field(
        default=None,
        metadata={"help": "Baseline-SFT model folder, decoded sequentially when reference or speed_reference is "
                          "baseline"},
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the candidates"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling of the candidates"})
    max_new_tokens: int = field(
        default=384,
        metadata={"help": "longest candidate, in tokens sampled by all its threads together, its first 64 tags "
                          "aside as the evaluation's decode.free_tag_tokens sets them (a sequential answer's budget; "
                          "the reference decode of stage.reference=baseline gets as many)"},
    )
    no_repeat_ngram_size: int = field(
        default=0,
        metadata={"help": "the decoders' repetition guard (decode.sampling.no_repeat_ngram_size: a thread never "
                          "writes the same N tokens twice) for every decode of the stage: the candidates, the "
                          "stage.reference=baseline answers and the held-out check; set it to what the evaluation "
                          "decodes with, so the rounds score the answers it will see; 0 = off"},
    )
    draft_skeleton: bool = field(
        default=False,
        metadata={"help": "the candidates and the held-out check decode with the skeleton draft "
                          "(decode.draft_skeleton: the same distribution of answers, a list in fewer steps), so the "
                          "speed reward counts the steps the evaluation takes when it decodes with it"},
    )
    sample_batch_size: int = field(
        default=8, metadata={"help": "prompts whose candidates decode at once while sampling (the next joins as one ends)"}
    )
    judge_retries: int = field(
        default=2,
        metadata={
            "help": "re-asks of the judge for candidates it could not score; then the prompt is skipped"
        },
    )
    candidates_from: str | None = field(
        default=None,
        metadata={"help": "another preference run's output_dir: round keep_rounds + 1 pairs and trains on the candidates "
                          "that run saved for it (with its Baseline-SFT answers) under this run's settings instead of "
                          "sampling new ones: an ablation of the pairing, training, judge or reference on the same "
                          "samples (judged again where this run's judge or references differ; pasta/training/rounds.py); "
                          "it must have started from this run's model.path; null = sample"},
    )
    keep_rounds: int = field(
        default=0,
        metadata={"help": "with candidates_from: that run's first N finished rounds are this run's own (models "
                          "hard-linked, not trained again), so round N + 1 starts from the policy that sampled its "
                          "candidates; 0 = round 1 re-pairs its round-1 candidates from model.path"},
    )
    heldout_path: str | None = field(
        default=None,
        metadata={
            "help": "prompts no round samples (.jsonl/.json with instruction and reference output; ones a round "
            "samples too are counted in train_info.json's heldout_check_sampled, with a warning), decoded "
            "greedily by the starting policy and after each round (pasta/training/heldout.py; heldout.json per "
            "round holds speedup, fork share and the judge's quality proxy); null = no held-out check"
        },
    )
    heldout_limit: int = field(default=32, metadata={"help": "held-out prompts (a seeded shuffle of the file)"})
    heldout_seed: int = field(default=0, metadata={"help": "seed of the held-out prompts' shuffle"})

    def trl_config(self) -> type:
        from trl import DPOConfig

        return DPOConfig

    def validate(self, where: str) -> None:
        super().validate(where)
        check_ranges(self, where, {
            "rounds": (lambda v: v >= 1, ">= 1"),
            "num_samples": (lambda v: v >= 2, ">= 2 (a pair needs two candidates)"),
            "pair_length_tolerance": (lambda v: v is None or v >= 0, ">= 0 or null"),
            "alpha": (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
            "quality_weight": (lambda v: v >= 0, ">= 0 (inf = quality only)"),
            "no_repeat_ngram_size": (lambda v: v >= 0, ">= 0 (0 = off)"),
            "keep_rounds": (lambda v: v >= 0, ">= 0"),
            "heldout_limit": (lambda v: v >= 1, ">= 1"),
            "max_new_tokens": (lambda v: v >= 1, ">= 1"),
            "sample_batch_size": (lambda v: v >= 1, ">= 1"),
            "judge_retries": (lambda v: v >= 0, ">= 0"),
            "beta": (lambda v: v > 0, "> 0 (the IPO margin is 1/(2 beta))"),
            "prompts_per_round": (lambda v: v is None or v >= 1, ">= 1, or null for every prompt"),
            "temperature": (lambda v: v >= 0, ">= 0"),
            "top_p": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        })
        if self.pair_length_tolerance is not None and self.rejected_side == RejectedSide.untagged:
            raise PastaError(f"{where}.pair_length_tolerance applies to rejected_side=worst or both; an untagged "
                             "side has the chosen answer's length already")
        if self.keep_rounds and not self.candidates_from:
            raise PastaError(f"{where}.keep_rounds={self.keep_rounds} is above 0 only with "
                             f"{where}.candidates_from=<the run whose rounds it keeps>")
        if self.candidates_from and self.keep_rounds >= self.rounds:
            raise PastaError(f"{where}.keep_rounds={self.keep_rounds} keeps every one of {where}.rounds={self.rounds}: "
                             f"raise {where}.rounds to at least {self.keep_rounds + 1}, the round that re-pairs "
                             f"{where}.candidates_from's candidates")
        for key in ("reference", "speed_reference"):
            if getattr(self, key) == Reference.baseline and not self.baseline_model:
                raise PastaError(f"{where}.{key}=baseline needs {where}.baseline_model=/path/to/baseline-sft/final")

    @property
    def speed_reference_kind(self) -> Reference:
        """The reference the latency speed rewards count steps against (stage.reference unless set apart)."""
        return self.speed_reference or self.reference


@dataclass(frozen=True)
class TrainingData:
    """The keys of the `data` node that training reads and the loader does not (pasta.data.DataConfig reads the
    rest). Each key's help is its comment in conf/train.yaml, which also sets the recipe's values (the docs' settings
    tables read both there); these defaults are the keys' "off" values, for a data node composed without them."""

    strip_annotations: bool = False
    min_promises: int = 0
    min_promise_share: float | None = None
    plain_per_promise: float = 0.0
    min_lead_words: int = 0

    def validate(self, where: str) -> None:
        check_ranges(self, where, {
            "min_promises": (lambda v: v >= 0, ">= 0"),
            "min_promise_share": (lambda v: v is None or 0 <= v <= 1, "in [0, 1], or null"),
            "plain_per_promise": (lambda v: v >= 0, ">= 0"),
            "min_lead_words": (lambda v: v >= 0, ">= 0"),
        })

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_data_cfg(cls, data_cfg: DictConfig | dict[str, Any]) -> TrainingData:
        """The training keys of a composed `data` node, typed and checked (one PastaError naming the key)."""
        return schema_from({key: data_cfg[key] for key in cls.field_names() if key in data_cfg}, cls, "data")


def settings_from_cfg(stage_cfg: DictConfig | dict[str, Any]) -> SFTSettings | PrefSettings:
    """The typed settings of the composed `cfg.stage` node (its `kind` picks sft or pref); an unknown key is an
    error."""
    schemas = {"sft": SFTSettings, "pref": PrefSettings}
    kind = stage_cfg.get("kind")
    if kind not in schemas:
        raise PastaError(f"unknown stage {kind!r}: use stage=sft or stage=pref")
    return schema_from(stage_cfg, schemas[kind], "stage")


def stage_settings(stage_cfg: DictConfig | dict[str, Any]) -> SFTSettings | PrefSettings:
    """`settings_from_cfg` at a stage's start, with the names only transformers knows checked too
    (`check_library_names`): before the data and the model load."""
    settings = settings_from_cfg(stage_cfg)
    settings.check_library_names("stage")
    return settings
