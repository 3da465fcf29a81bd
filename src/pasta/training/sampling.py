"""The preference stage's candidates: reference answers, and sampled answers scored for speed and quality.

For the prompts of a round, `sample_and_score` samples `num_samples` candidates per prompt with the asynchronous
decoder (temperature sampling; `sample_batch_size` prompts' candidates decode at once, continuously batched; each
candidate seeded by (seed, prompt, sample), so a resumed or resharded round samples the same answers), scores each
for speed (the decoder's theoretical speedup) and quality (`judge.score` of its plain text against the prompt's
reference answer, asked again `judge_retries` times for the items it could not score), and appends one record per
prompt to `scores.jsonl` once its candidates are judged, with the reference answer's length in tokens (what the
latency speed reward compares a candidate's steps with). `reference_answers` gives those references: the records'
own outputs, or Baseline-SFT's greedy answers decoded once; the judge's and the speed reward's may differ
(`References`). Both resume from their files and shard their prompts over the processes of `accelerate launch`
(pasta.parallel).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig

from pasta.config import resolve_device
from pasta.data import Record, read_jsonl, write_jsonl_atomic
from pasta.decoding.config import decode_difference
from pasta.errors import PastaError
from pasta.lang import ReservationPolicy, encode_text
from pasta.models import encode_prompt, load_model, model_at
from pasta.parallel import Processes, ShardedJsonl
from pasta.records import as_json
from pasta.training.candidates import Candidate, ScoredPrompt
from pasta.training.config import PrefSettings, Reference
from pasta.training.examples import example_from_doc
from pasta.training.rounds import BASELINE_ANSWERS

if TYPE_CHECKING:
    from pasta.decoding import DecodeConfig

log = logging.getLogger(__name__)


def thread_ids(doc) -> dict[str, Any]:
    """A sampled answer's ids per thread, as training examples hold them (without the prompt)."""
    example = example_from_doc([], doc)
    del example["prompt_ids"]
    return example


def judge_with_retries(judge, items: list, retries: int) -> list[float | None]:
    """`judge.score`, asking again for the items it could not score (None), up to `retries` more times."""
    scores = judge.score(items)
    for _ in range(retries):
        missing = [i for i, score in enumerate(scores) if score is None]
        if not missing:
            break
        log.warning("judge %s could not score %d item(s); asking again", judge.name, len(missing))
        for i, score in zip(missing, judge.score([items[i] for i in missing]), strict=True):
            scores[i] = score
    return scores


# --- references ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class References:
    """Each prompt's reference answers, by record id: the one the judge compares a candidate with
    (stage.reference) and the one whose tokens the latency speed rewards count its steps against
    (stage.speed_reference; the same answers unless it is set apart)."""

    quality: dict[str, str]
    speed: dict[str, str]


def round_references(
    records: list[Record],
    settings: PrefSettings,
    cfg: DictConfig,
    output_dir: Path,
    processes: Processes = Processes(),
) -> References:
    """The judge's and the speed reward's references of the records (Baseline-SFT decoded at most once)."""
    quality = reference_answers(records, settings.reference, settings, cfg, output_dir, processes)
    if settings.speed_reference_kind == settings.reference:
        return References(quality=quality, speed=quality)
    speed = reference_answers(records, settings.speed_reference_kind, settings, cfg, output_dir, processes)
    return References(quality=quality, speed=speed)


def reference_answers(
    records: list[Record],
    kind: Reference,
    settings: PrefSettings,
    cfg: DictConfig,
    output_dir: Path,
    processes: Processes = Processes(),
) -> dict[str, str]:
    """Reference answer per record id: the record's `output`, or the Baseline-SFT model's greedy answer
    (decoded once, kept in `<output_dir>/baseline_answers.jsonl` and reused on resume)."""
    if kind == Reference.output:
        return {r.id: r.output for r in records}
    from pasta.decoding import DecodeConfig, SamplingConfig, decode_sequential

    path = output_dir / BASELINE_ANSWERS
    store = ShardedJsonl(path, processes, key="id")
    store.gather()
    done = store.keys()
    todo = processes.shard([r for r in records if r.id not in done])
    if todo:
        model_cfg = model_at(cfg.model, settings.baseline_model)
        model, tokenizer = load_model(model_cfg, device=resolve_device(cfg.get("device", "auto")),
                                      path_key="stage.baseline_model")
        config = DecodeConfig(
            max_new_tokens=settings.max_new_tokens,
            sampling=SamplingConfig(temperature=0.0, no_repeat_ngram_size=settings.no_repeat_ngram_size),
        )
        with store.appender() as out:
            prompts = [encode_prompt(tokenizer, r.instruction, r.input) for r in todo]
            # Continuous batching (sample_batch_size at once); each answer is saved as it ends.
            decode_sequential(model, tokenizer, prompts, config, max_batch=settings.sample_batch_size,
                              on_result=lambda i, result: out.append({"id": todo[i].id, "text": result.text}))
        del model
    store.gather(order=[r.id for r in records])
    return {a["id"]: a["text"] for a in store.records()}


# --- sampling and scoring ------------------------------------------------------------------------------------


def reference_num_tokens(tokenizer, reference: str) -> int:
    """The steps a sequential decode of `reference` takes: its tokens, eos included (ScoredPrompt's field)."""
    return len(encode_text(tokenizer, reference)) + 1


def candidate_decode_config(settings: PrefSettings) -> DecodeConfig:
    """How a round's candidates are decoded: the stage's budget and sampling, the decoder's defaults otherwise."""
    from pasta.decoding import DecodeConfig, SamplingConfig

    sampling = SamplingConfig(temperature=settings.temperature, top_p=settings.top_p,
                              no_repeat_ngram_size=settings.no_repeat_ngram_size)
    return DecodeConfig(max_new_tokens=settings.max_new_tokens, max_total_tokens=settings.max_new_tokens,
                        sampling=sampling, draft_skeleton=settings.draft_skeleton)


def sampling_settings(settings: PrefSettings) -> dict[str, Any]:
    """The settings that decide what a round's candidates are (not how they are paired: stage.quality_weight
    and stage.speed_reward apply to saved scores, so rounds that differ only in them can share a scores file): the
    stage's, and under `decoding` the decoder's whole config, the defaults the stage does not set included, so
    candidates drawn by a decoder whose defaults have since changed are not paired with new ones (files written
    before it was recorded hold the stage's alone)."""
    return {"num_samples": settings.num_samples, "temperature": settings.temperature, "top_p": settings.top_p,
            "max_new_tokens": settings.max_new_tokens, "no_repeat_ngram_size": settings.no_repeat_ngram_size,
            "decoding": as_json(asdict(candidate_decode_config(settings)))}


def scoring_difference(entry: ScoredPrompt, references: References, judge_name: str, tokenizer) -> str | None:
    """How a saved prompt's candidates were scored otherwise than this run scores them (another judge, another
    reference answer, a latency reference of other tokens), in words; None when alike. What an older file does not
    record (`reference_num_tokens`) passes."""
    if entry.judge != judge_name:
        return f"judged by {entry.judge}, this run's judge is {judge_name}"
    if entry.id in references.quality and entry.reference != references.quality[entry.id]:
        return f"judged against another reference answer of prompt {entry.id} (stage.reference)"
    if entry.reference_num_tokens is not None and entry.id in references.speed:
        num_tokens = reference_num_tokens(tokenizer, references.speed[entry.id])
        if entry.reference_num_tokens != num_tokens:
            return (f"timed against a {entry.reference_num_tokens}-token reference of prompt {entry.id}, this "
                    f"run's has {num_tokens} (stage.speed_reference)")
    return None


def check_saved_scores(saved: list[ScoredPrompt], references: References, judge_name: str,
                       sampling: dict[str, Any], tokenizer, scores_path: Path) -> None:
    """Refuse to resume a round whose saved candidates were drawn or scored under other settings than this run's:
    pairing them with new ones would mix two experiments in silence. What an older file does not record passes."""

    def refuse(what: str) -> None:
        raise PastaError(f"{scores_path} holds candidates {what}: resume with the run's settings, or pass another "
                         "output_dir (the saved candidates are kept)")

    for entry in saved:
        for key, value in sampling.items():
            if entry.sampling is None or key not in entry.sampling:
                continue
            if key == "decoding":
                difference = decode_difference(entry.sampling[key], value)
            else:
                difference = None if entry.sampling[key] == value else (f"stage.{key}", entry.sampling[key], value)
            if difference is not None:
                name, recorded, asked = difference
                refuse(f"sampled with {name}={recorded}, this run asks {asked}")
        scored_otherwise = scoring_difference(entry, references, judge_name, tokenizer)
        if scored_otherwise is not None:
            refuse(scored_otherwise)


def rejudge_saved_scores(scores_path: Path, references: References, judge, tokenizer, retries: int) -> int:
    """Score again, with this run's judge against its references, the candidates another run drew and
    `stage.candidates_from` copied to `scores_path`: an ablation of the judge or the reference on the same samples.
    Only the judge's scores and the references change (the candidates and their sampling settings are kept, and
    `check_saved_scores` still refuses those drawn otherwise); the file is rewritten whole, so a kill leaves the old
    one or the new. Returns how many prompts were judged again."""
    from pasta.judges import JudgeItem

    saved = [ScoredPrompt.from_json(r) for r in read_jsonl(scores_path)]
    # A taken file written before `reference_num_tokens` was kept is judged again to fill it in (a resume passes it).
    stale = [e for e in saved if e.id in references.quality
             and (e.reference_num_tokens is None or scoring_difference(e, references, judge.name, tokenizer))]
    if not stale:
        return 0
    items = [JudgeItem(e.instruction, c.text, references.quality[e.id]) for e in stale for c in e.candidates]
    qualities = iter(judge_with_retries(judge, items, retries))
    judged = {}
    for entry in stale:
        candidates = [replace(c, quality=next(qualities), judge=judge.name) for c in entry.candidates]
        judged[entry.id] = replace(
            entry,
            reference=references.quality[entry.id],
            reference_num_tokens=reference_num_tokens(tokenizer, references.speed[entry.id]),
            judge=judge.name,
            status="judge_failed" if any(c.quality is None for c in candidates) else "scored",
            candidates=candidates,
        )
    write_jsonl_atomic(scores_path, [judged.get(e.id, e).to_json() for e in saved])
    return len(stale)


def candidate_record(result, quality: float | None, judge_name: str) -> Candidate:
    """One sampled candidate as `scores.jsonl` keeps it: its text, scores (with the judge's name) and thread ids."""
    stats = result.stats
    return Candidate(
        text=result.text,
        annotated=result.annotated,
        speedup=stats.theoretical_speedup,
        quality=quality,
        judge=judge_name,
        num_tokens=stats.num_tokens,
        num_steps=stats.num_steps,
        finish_reason=stats.finish_reason,
        malformed=stats.malformed,
        tokens=thread_ids(result.token_doc),
    )


def sample_and_score(
    model,
    tokenizer,
    prompts: list[Record],
    references: References,
    judge,
    settings: PrefSettings,
    policy: ReservationPolicy,
    scores_path: Path,
    seed: int,
    processes: Processes = Processes(),
) -> list[ScoredPrompt]:
    """Score records of every prompt, sampling only those not yet in `scores_path` (see the module docstring);
    each process samples its share of them."""
    from pasta.decoding import decode_async
    from pasta.judges import JudgeItem

    store = ShardedJsonl(scores_path, processes, key="id")
    store.gather()
    done = store.keys()
    settings_drawn = sampling_settings(settings)
    check_saved_scores([ScoredPrompt.from_json(r) for r in store.records()], references, judge.name,
                       settings_drawn, tokenizer, scores_path)
    config = candidate_decode_config(settings)
    num = settings.num_samples
    todo = [(index, r) for index, r in enumerate(prompts) if r.id not in done]
    if len(todo) < len(prompts) and processes.is_main:
        log.info("%s: %d of %d prompts' candidates saved already, %d to sample", scores_path,
                 len(prompts) - len(todo), len(prompts), len(todo))
    todo = processes.shard(todo)
    model.eval()
    prompt_ids = [encode_prompt(tokenizer, r.instruction, r.input) for _, r in todo]
    drawn: list[dict[int, Any]] = [{} for _ in todo]  # todo's prompt b -> its candidates ended so far, by sample
    ready: list[int] = []  # prompts whose candidates have all ended, to judge

    def judge_ready(out) -> None:
        """Judge the ready prompts' candidates in one call (sample_batch_size prompts, as a static batch had) and
        append a line per prompt."""
        results = [[drawn[b].pop(k) for k in range(num)] for b in ready]
        items = [JudgeItem(todo[b][1].instruction, result.text, references.quality[todo[b][1].id])
                 for b, candidates in zip(ready, results, strict=True) for result in candidates]
        qualities = judge_with_retries(judge, items, settings.judge_retries)
        for g, (b, candidates) in enumerate(zip(ready, results, strict=True)):
            index, record = todo[b]
            scored = [candidate_record(result, quality, judge.name)
                      for result, quality in zip(candidates, qualities[g * num : (g + 1) * num], strict=True)]
            entry = ScoredPrompt(
                reference_num_tokens=reference_num_tokens(tokenizer, references.speed[record.id]),
                id=record.id,
                prompt_index=index,
                instruction=record.instruction,
                input=record.input,
                reference=references.quality[record.id],
                prompt_ids=prompt_ids[b],
                judge=judge.name,
                status="judge_failed" if any(c.quality is None for c in scored) else "scored",
                candidates=scored,
                sampling=settings_drawn,
            )
            out.append(entry.to_json())
        ready.clear()

    with store.appender() as out:

        def ended(i: int, result) -> None:
            b, k = divmod(i, num)
            drawn[b][k] = result
            if len(drawn[b]) == num:
                ready.append(b)
                if len(ready) == settings.sample_batch_size:
                    judge_ready(out)

        if todo:
            # Continuous batching: sample_batch_size prompts' candidates decode at once, and as one candidate ends
            # the next one joins, so the batch never waits for its longest candidate to start the next prompts.
            with torch.inference_mode():
                decode_async(model, tokenizer, [ids for ids in prompt_ids for _ in range(num)], config, policy,
                             seeds=[seed + index * num + k for index, _ in todo for k in range(num)],
                             max_batch=settings.sample_batch_size * num, on_result=ended)
        if ready:
            judge_ready(out)
    store.gather(order=[r.id for r in prompts])
    scored = {r["id"]: r for r in store.records()}
    return [ScoredPrompt.from_json(scored[r.id]) for r in prompts]
