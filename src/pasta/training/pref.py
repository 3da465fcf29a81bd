"""Stage 2, preference optimisation: `python -m pasta.train stage=pref model.path=<sft run>/final data.path=...`.

Round r (folder `<output_dir>/round-<r>`) starts from the policy of round r-1 (round 1: `model`):
1. sample `num_samples` candidates per prompt with the asynchronous decoder (temperature sampling, prompts
   batched, each candidate seeded by (seed, round, prompt, sample), so a resumed round samples the same answers);
2. score them: speed = `stage.speed_reward` (latency: the reference answer's tokens over the candidate's decoding
   steps; theoretical: the candidate's tokens over its steps); quality = `judge.score` of the candidate's plain text
   against the reference answer (the record's `output` by default, or a sequential greedy decode of the
   Baseline-SFT model with `stage.reference=baseline`; `stage.speed_reference` gives the latency rewards another
   one); candidates the judge could not score are asked again
   `judge_retries` times, then the prompt is marked `judge_failed` and skipped, never scored as zero. Each prompt's
   record goes to `scores.jsonl` (appended and fsynced: a crash loses at most the batch in flight), the judge's
   name next to every score;
3. pair the best and the worst candidate by speed + lambda * quality (`pairs.jsonl`; ties skipped; with
   `stage.pair_length_tolerance` the worst of those about as long as the best; with `stage.quality_floor` no chosen
   side judged below its prompt's median candidate; with `stage.rejected_side=untagged`
   the best fork against its own words untagged, with `both` both pairs, pasta.training.pairs); each prompt's
   best well-formed fork that ended by itself and is judged no worse than its median candidate goes to
   `forking.jsonl` as an SFT record (pasta.training.feedback; `data.extra_paths` trains on them);
4. train BoNBoN, alpha * SFT(best) + (1 - alpha) * IPO(margin), with TRL's DPOTrainer (its "sft" and "ipo" loss
   types and weights) on the PASTA-LANG layout, the reference being the round's starting policy; write
   `round-<r>/final` and `round-<r>/metrics.json`.
A crashed run continues with `resume=true`: finished rounds are kept, sampling picks up after the last prompt
written, training from its last checkpoint. `stage.candidates_from` pairs another run's saved candidates again
under this run's settings (pasta.training.rounds), judged again when this run's judge or references differ.

`accelerate launch -m pasta.train stage=pref ...` shards the reference decodes, the sampling and judging of each round
and the held-out check over the processes (pasta.parallel); every process reads the gathered scores, so all form the
same pairs, and the round trains under the same launch (DDP). Candidates are seeded per prompt and sample, so any
process count samples the same candidates.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.config import resolve_device
from pasta.data import Record, load_training_records, write_json_atomic, write_jsonl_atomic
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy, add_tag_tokens
from pasta.models import load_model, load_tokenizer, model_at
from pasta.models.trained_lang import decoding_policy
from pasta.parallel import current_processes
from pasta.training.candidates import Pair
from pasta.training.collator import PairCollator
from pasta.training.config import Finetune, PrefSettings, Reference, TooLong, TrainingData, stage_settings
from pasta.training.examples import (
    loader_config,
    num_rows,
    plain_answer_ids,
    skipped_as_too_long,
    with_min_promises,
)
from pasta.training.feedback import forking_records
from pasta.training.heldout import HeldoutCheck, HeldoutSummary, heldout_records
from pasta.training.modeling import check_sharding, expose_head_bias, lora_config, save_base_once, save_final
from pasta.training.pairs import json_number, make_pairs, summarize
from pasta.training.rounds import (
    ROUND_METRICS,
    SCORES,
    check_saved_rounds,
    finished_round_metrics,
    round_folder,
    take_saved_rounds,
)
from pasta.training.runs import check_same_model, checkpoint_to_resume, resolve_output_dir, write_train_info
from pasta.training.sampling import References, rejudge_saved_scores, round_references, sample_and_score

log = logging.getLogger(__name__)

FORKING_RECORDS = "forking.jsonl"  # the round's best forking answers, as SFT records (pasta.training.feedback)


def round_prompts(records: list[Record], settings: PrefSettings, round_index: int) -> list[Record]:
    """The prompts of round `round_index` (1-based): a window of `prompts_per_round` that moves on each round."""
    count = settings.prompts_per_round
    if count is None or count >= len(records):
        return list(records)
    start = ((round_index - 1) * count) % len(records)
    return [records[(start + i) % len(records)] for i in range(count)]


# --- training ------------------------------------------------------------------------------------------------


def pair_rows(pair: Pair) -> int:
    """Rows of the pair's longer side's layout (prompt, main thread, every chunk)."""
    return max(num_rows({"prompt_ids": pair.prompt_ids, **side.tokens}) for side in (pair.chosen, pair.rejected))


def fit_pairs(pairs: list[Pair], max_length: int, too_long: TooLong) -> tuple[list[Pair], int, int]:
    """The pairs trained under `stage.max_length`, how many were skipped as too long and how many are cut, as SFT
    treats its examples: a pair longer than `max_length` rows is skipped (`too_long=skip`) or trained on its sides'
    first `max_length` rows (`truncate`: a forked side loses its chunk bodies first, as they follow the main
    thread); a prompt that alone fills `max_length` leaves nothing to train on and is always skipped."""
    kept, num_skipped, num_cut = [], 0, 0
    for pair in pairs:
        rows = pair_rows(pair)
        if skipped_as_too_long(rows, len(pair.prompt_ids), max_length, too_long):
            num_skipped += 1
            continue
        if rows > max_length:
            num_cut += 1
        kept.append(pair)
    return kept, num_skipped, num_cut


def pair_examples(pairs: list[Pair]) -> list[dict[str, Any]]:
    """What PairCollator takes (a datasets row each): the prompt ids and each side's thread ids, and the rows of its
    longer side's layout (`length`, what stage.group_by_length batches by)."""
    return [
        {"prompt": {"prompt_ids": p.prompt_ids}, "chosen": p.chosen.tokens, "rejected": p.rejected.tokens,
         "length": pair_rows(p)}
        for p in pairs
    ]


def train_round(
    model,
    tokenizer,
    pairs,
    settings: PrefSettings,
    cfg: DictConfig,
    round_dir: Path,
    policy: ReservationPolicy,
    resume: bool,
) -> dict[str, Any]:
    """BoNBoN on the round's pairs; writes `round_dir/final`; returns the trainer's metrics."""
    from datasets import Dataset

    from pasta.training.trainers import LayoutDPOTrainer

    tag_ids = add_tag_tokens(tokenizer, model)
    checkpoint_dir = round_dir / "checkpoints"
    resume_from = checkpoint_to_resume(checkpoint_dir, resume)
    args = bonbon_args(settings, cfg, checkpoint_dir)
    peft_config = lora_config(settings.lora, model, tag_ids) if settings.finetune == Finetune.lora else None
    if peft_config is None:
        # The round's policy was loaded to sample (bfloat16 on a GPU): full finetuning updates float32 weights, as
        # SFT's, under mixed_precision's autocast; bfloat16 weights would round a small step away. (LoRA's adapter
        # rows are float32 whatever the base's dtype.)
        model.float()
    if peft_config is not None and not settings.merge_lora:
        save_base_once(model, tokenizer, round_dir / "base")  # the round's adapter is saved against its start
    # Full finetuning needs an explicit reference (DPOTrainer would reload it by name); under LoRA the reference is
    # the model with its adapter switched off, which is the round's starting policy.
    ref_model = copy.deepcopy(model).eval() if peft_config is None else None
    collator = PairCollator(
        tag_ids=tag_ids,
        pad_id=tokenizer.pad_token_id,
        policy=policy,
        max_length=settings.max_length,
        mask_dtype=model.dtype,
    )
    model.train()
    trainer = LayoutDPOTrainer(
        model=model,
        ref_model=ref_model,
        args=args,
        data_collator=collator,
        train_dataset=Dataset.from_list(pair_examples(pairs)),
        processing_class=tokenizer,
        peft_config=peft_config,
        precompute_ref_log_probs=settings.precompute_ref_log_probs,
    )
    expose_head_bias(trainer.model)
    check_sharding(trainer, settings)
    result = trainer.train(resume_from_checkpoint=resume_from)
    save_final(trainer, tokenizer, settings, round_dir, policy)
    return round_train_metrics(result.metrics, trainer.state.log_history)


def bonbon_args(settings: PrefSettings, cfg: DictConfig, checkpoint_dir: Path):
    """TRL's DPOConfig for BoNBoN: its "sft" and "ipo" losses weighted alpha and 1 - alpha (IPO's beta is one of
    the settings that pass through by name)."""
    from trl import DPOConfig

    kwargs = settings.trainer_kwargs(checkpoint_dir, cfg)
    # TRL would score the pairs in the trainer's constructor, before pasta's CPU LM head and layout attention are in
    # place; LayoutDPOTrainer scores them when training starts instead (stage.precompute_ref_log_probs).
    kwargs["precompute_ref_log_probs"] = False
    return DPOConfig(**kwargs, loss_type=["sft", "ipo"], loss_weights=[settings.alpha, 1.0 - settings.alpha])


def round_train_metrics(metrics: dict[str, Any], log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer's final metrics, with the loss and margin of every logged step and the last log entry."""
    logged = [entry for entry in log_history if "loss" in entry]
    return {
        **metrics,
        "loss_history": [entry["loss"] for entry in logged],
        # TRL's implicit reward margin (beta * chosen-minus-rejected log-ratio) per logged step: it rising is
        # the round learning its pairs, which is not yet the policy's greedy answers improving (heldout.json).
        "margin_history": [entry["rewards/margins"] for entry in logged if "rewards/margins" in entry],
        "last_log": logged[-1] if logged else {},
    }


def run_round(
    cfg, settings, round_index, policy_path, records, references, judge, policy, output_dir, processes
) -> Path:
    round_dir = round_folder(output_dir, round_index)
    round_dir.mkdir(parents=True, exist_ok=True)
    resume = bool(cfg.get("resume", False))
    scores_path = round_dir / SCORES
    model_cfg = cfg.model if policy_path is None else model_at(cfg.model, policy_path)
    # A round's policy is a folder the run wrote: errors name it alone, not as the user's model.path.
    model, tokenizer = load_model(model_cfg, device=resolve_device(cfg.get("device", "auto")),
                                  path_key="model.path" if policy_path is None else None)
    add_tag_tokens(tokenizer, model)
    prompts = round_prompts(records, settings, round_index)
    seed = (int(cfg.get("seed") or 0) * 1000 + round_index) * 1_000_003
    start = time.perf_counter()
    scored = sample_and_score(
        model, tokenizer, prompts, references, judge, settings, policy, scores_path, seed, processes
    )
    sample_seconds = time.perf_counter() - start
    pairs, skipped = make_pairs(scored, settings.quality_weight, settings.speed_reward,
                                settings.pair_length_tolerance, settings.rejected_side,
                                lambda text, ended: plain_answer_ids(tokenizer, text, ended), settings.quality_floor,
                                settings.chosen_must_end)
    pairs, num_too_long, num_cut = fit_pairs(pairs, settings.max_length, settings.too_long)
    if num_too_long:
        skipped["too_long"] += num_too_long
    if num_cut:
        log.warning("round %d: %d of %d pairs are longer than stage.max_length=%d rows and are trained on their "
                    "first %d (a fork's chunks are cut first); raise stage.max_length or set stage.too_long=skip",
                    round_index, num_cut, len(pairs), settings.max_length, settings.max_length)
    summary = {**summarize(scored, pairs, skipped, settings.quality_weight, settings.speed_reward),
               "num_pairs_cut": num_cut}
    forking = forking_records(scored, settings.quality_weight, settings.speed_reward, round_index)
    summary["num_forking_records"] = len(forking)
    if processes.is_main:
        write_jsonl_atomic(round_dir / "pairs.jsonl", [pair.to_json() for pair in pairs])
        write_jsonl_atomic(round_dir / FORKING_RECORDS, forking)
        log.info("round %d: %s", round_index, summary)
        log.info("round %d: %d of %d prompts have a well-formed, ended fork judged no worse than their median "
                 "candidate: %s (SFT data: data.extra_paths)", round_index, len(forking), len(scored),
                 round_dir / FORKING_RECORDS)
    if not pairs:
        raise PastaError(
            f"round {round_index}: no pairs from {len(scored)} prompts ({dict(skipped)}); sample more candidates "
            "(stage.num_samples), raise stage.temperature, or check the judge"
        )
    start = time.perf_counter()
    train_metrics = train_round(model, tokenizer, pairs, settings, cfg, round_dir, policy, resume)
    metrics = {
        "round": round_index,
        "status": "done",
        "policy": str(policy_path)
        if policy_path
        else OmegaConf.to_container(cfg.model, resolve=True).get("path"),
        "judge": judge.name,
        "quality_weight": json_number(settings.quality_weight),
        **summary,
        "sample_seconds": sample_seconds,
        "train_seconds": time.perf_counter() - start,
        "train": train_metrics,
    }
    if processes.is_main:
        write_json_atomic(round_dir / ROUND_METRICS, metrics)
    processes.wait()  # every process reads the round's metrics next
    return round_dir / "final"


def check_latency_references(settings: PrefSettings, records: list[Record], references: References) -> None:
    """The latency speed reward prices a candidate's steps against its prompt's reference answer: every prompt
    needs one. Prompt-only data has none unless Baseline-SFT decodes them (whose decode, even an empty answer, is
    a reference: it took its steps)."""
    if not settings.speed_reward.needs_reference or settings.speed_reference_kind == Reference.baseline:
        return
    missing = [r for r in records if not references.speed[r.id].strip()]
    if missing:
        raise PastaError(
            f"stage.speed_reward={settings.speed_reward} compares each candidate's steps with its reference answer, but "
            f"{len(missing)} of {len(records)} prompts have none (first: {missing[0].instruction[:60]!r}): set "
            "stage.speed_reference=baseline with stage.baseline_model=<Baseline-SFT>/final, or "
            "stage.speed_reward=theoretical"
        )


def run_pref(cfg: DictConfig) -> Path:
    """Run every preference round `cfg` asks for; returns the last round's final model folder."""
    from pasta.judges import build_judge

    settings = stage_settings(cfg.stage)
    assert isinstance(settings, PrefSettings)
    processes = current_processes()
    output_dir = resolve_output_dir(cfg)
    policy = decoding_policy(cfg.lang.reservation, cfg.model)  # the starting policy's, checked
    # Read before the training data and Baseline-SFT's references: a wrong file fails in seconds, not minutes.
    check_records = ([] if settings.heldout_path is None
                     else heldout_records(settings.heldout_path, settings.heldout_limit, settings.heldout_seed))
    min_promises = TrainingData.from_data_cfg(cfg.data).min_promises
    records, loaded = load_training_records(loader_config(cfg.data))  # never a held-out pool prompt
    if not records:
        raise PastaError(f"stage=pref needs prompts: data {cfg.data.name} has none left: {loaded.why_empty()}")
    records = with_min_promises(records, min_promises)
    if not records:
        raise PastaError(f"stage=pref needs prompts: none of data {cfg.data.name}'s has data.min_promises="
                         f"{min_promises} promises")
    if any(output_dir.glob("round-*")) and not cfg.get("resume", False):
        raise PastaError(
            f"{output_dir} holds an earlier run: pass resume=true to continue it, or another output_dir"
        )
    check_same_model(output_dir, cfg.model)
    if settings.candidates_from:
        source = Path(settings.candidates_from).expanduser()
        check_saved_rounds(source, output_dir, settings.keep_rounds, cfg.model)  # on every process: all stop
        if processes.is_main:
            take_saved_rounds(source, output_dir, settings.keep_rounds)
    processes.wait()  # every process has looked (and the main one taken saved rounds) before any writes
    # Only the rounds' prompts need a reference: Baseline-SFT answers for the whole pool cost minutes for nothing.
    used_ids = {r.id for i in range(1, settings.rounds + 1) for r in round_prompts(records, settings, i)}
    used = [r for r in records if r.id in used_ids]
    references = round_references(used, settings, cfg, output_dir, processes)
    check_latency_references(settings, used, references)
    judge = build_judge(cfg.judge)
    if settings.candidates_from and processes.is_main:
        scores = round_folder(output_dir, settings.keep_rounds + 1) / SCORES
        num_judged = rejudge_saved_scores(scores, references, judge, load_tokenizer(cfg.model), settings.judge_retries)
        if num_judged:
            log.info("%s: judged the candidates of %d prompts again, by %s against this run's references (the "
                     "saved ones were judged otherwise)", scores, num_judged, judge.name)
    processes.wait()  # the main process has judged the taken candidates again before any process reads them
    heldout = HeldoutCheck(cfg, settings, check_records, judge, policy, processes)
    num_check_sampled = heldout.num_sampled(used)
    if num_check_sampled:
        log.warning("%d of the %d held-out check prompts (stage.heldout_path) are prompts the rounds sample: the "
                    "check is not held out on them (train_info.json: heldout_check_sampled)", num_check_sampled,
                    len(heldout.records))
    if processes.is_main:
        write_train_info(output_dir, cfg, stage="pref", status="running", judge=judge.name, loaded=loaded.as_dict(),
                         heldout_check_sampled=num_check_sampled)
    start = heldout.run(None, round_folder(output_dir, 0))
    rounds = []
    policy_path: Path | None = None
    for round_index in range(1, settings.rounds + 1):
        round_dir = round_folder(output_dir, round_index)
        metrics_path = round_dir / ROUND_METRICS
        metrics = finished_round_metrics(round_dir, round_index)
        if metrics is not None:
            log.info("round %d already done: %s", round_index, round_dir)
        else:
            run_round(
                cfg, settings, round_index, policy_path, records, references, judge, policy, output_dir, processes
            )
            metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        policy_path = round_dir / "final"
        summary = heldout.run(policy_path, round_dir)
        if summary is not None:
            metrics["heldout"] = asdict(summary)
        if processes.is_main:
            log.info("round %d: %s", round_index, round_line(metrics, start, summary))
        rounds.append(metrics)
    if processes.is_main:
        write_train_info(
            output_dir,
            cfg,
            stage="pref",
            status="done",
            judge=judge.name,
            loaded=loaded.as_dict(),
            heldout_check_sampled=num_check_sampled,
            final_dir=str(policy_path),
            rounds=rounds,
            **({"heldout_start": asdict(start)} if start is not None else {}),
        )
    return policy_path


def round_line(metrics: dict[str, Any], start: HeldoutSummary | None, heldout: HeldoutSummary | None) -> str:
    """What a round did to its reward, in one log line: samples, pairs, and (when checked) held-out answers."""

    def number(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    margins = metrics["train"].get("margin_history") or [None]
    line = (
        f"sample reward {number(metrics['mean_score'])}, chosen-minus-rejected score "
        f"{number(metrics['mean_score_margin'])}, IPO margin at the end {number(margins[-1])}"
    )
    if heldout is not None and start is not None:
        line += f"; {heldout.line()} (start: speedup {start.mean_speedup:.3f}, proxy {number(start.quality_proxy)})"
    return line
