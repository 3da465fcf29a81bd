"""The preference stage's held-out check: greedy answers of a policy on prompts no round samples.

A round's own numbers (the reward of its samples, TRL's chosen-minus-rejected margin) say that it learned its
pairs; they do not say that the policy got faster at equal quality. So, with `stage.heldout_path` set, the starting
policy (`round-0/`) and each round's final policy (`round-<r>/`) decode the same `stage.heldout_limit` prompts
greedily with the asynchronous decoder, and `heldout.json` keeps what PASTA is about, per policy:
- the mean theoretical speedup (tokens / forward steps) and the share of answers that fork;
- malformed-output events per answer;
- the quality proxy: the stage's judge scoring each plain answer against the record's reference answer (with the
  default embedding judge, cosine similarity to e.g. the GPT-4 Turbo answer of AlpacaEval). A proxy, labelled with
  the judge's name, not a win rate.
Answers go to `heldout.jsonl` one line per prompt as they are decoded, each with the decode settings that gave it,
so a killed check resumes where it stopped, and refuses to when the settings changed (a summary over two decoders'
answers would compare nothing). Answers another judge scored (a check taken from another run under another judge,
`stage.candidates_from`) are judged again, never averaged with this judge's. Under `accelerate launch` each process
decodes its share and the main process gathers them (pasta.parallel).
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from pasta.config import resolve_device
from pasta.data import Record, load_instructions, read_jsonl, write_json_atomic, write_jsonl_atomic
from pasta.data.heldout import prompt_key
from pasta.decoding import DecodeConfig, DecodeResult, SamplingConfig, decode_async
from pasta.decoding.config import decode_difference
from pasta.errors import PastaError
from pasta.judges import JudgeItem
from pasta.lang import ReservationPolicy, add_tag_tokens, strip_annotations
from pasta.models import encode_prompt, load_model, model_at
from pasta.parallel import Processes, ShardedJsonl
from pasta.records import as_json
from pasta.training.config import PrefSettings

log = logging.getLogger(__name__)

ANSWERS = "heldout.jsonl"
SUMMARY = "heldout.json"


@dataclass(frozen=True)
class HeldoutSummary:
    """One policy's greedy answers on the held-out prompts, in numbers."""

    num_prompts: int
    mean_speedup: float  # theoretical: tokens / forward steps, averaged over answers
    fork_share: float  # answers that forked at least one chunk
    malformed_per_answer: float
    quality_proxy: float | None  # mean judge score against the reference; None if the judge scored nothing
    judge: str  # whose scores quality_proxy averages
    # What wall-clock time follows: steps (and the tokens behind them). None in checks written before they were kept.
    mean_tokens: float | None = None
    mean_steps: float | None = None

    def line(self) -> str:
        proxy = "n/a" if self.quality_proxy is None else f"{self.quality_proxy:.3f}"
        steps = "" if self.mean_steps is None else f", steps/answer {self.mean_steps:.1f}"
        return (
            f"held-out speedup {self.mean_speedup:.3f}{steps}, forks {self.fork_share:.0%}, malformed/answer "
            f"{self.malformed_per_answer:.2f}, quality proxy ({self.judge}) {proxy} over {self.num_prompts} prompts"
        )


def heldout_records(path: str, limit: int, seed: int, key: str = "stage.heldout_path") -> list[Record]:
    """`limit` records of the file at `path`, shuffled with `seed`: the same prompts for every policy. `key` is the
    setting an error names."""
    if not Path(path).is_file():
        raise PastaError(f"{key}={path}: no such file (a .jsonl or .json of prompts with reference outputs)")
    return load_instructions({"name": "heldout", "path": path, "shuffle": True, "seed": seed, "limit": limit})


def check_policy(
    model,
    tokenizer,
    records: list[Record],
    judge,
    policy: ReservationPolicy,
    max_new_tokens: int,
    batch_size: int,
    out_dir: Path,
    processes: Processes = Processes(),
    no_repeat_ngram_size: int = 0,
    draft_skeleton: bool = False,
) -> HeldoutSummary:
    """Decode `records` greedily, with the stage's repetition guard and skeleton draft (resuming from
    `out_dir/heldout.jsonl`), judge them, write `heldout.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    answers_path = out_dir / ANSWERS
    store = ShardedJsonl(answers_path, processes, key="id")
    store.gather()
    config = DecodeConfig(max_new_tokens=max_new_tokens, max_total_tokens=max_new_tokens,
                          sampling=SamplingConfig(temperature=0.0, no_repeat_ngram_size=no_repeat_ngram_size),
                          draft_skeleton=draft_skeleton)
    decoding = as_json(asdict(config))
    check_saved_answers(store.records(), decoding, answers_path)
    done = store.keys()
    todo = processes.shard([r for r in records if r.id not in done])
    model.eval()
    ended: list[tuple[Record, DecodeResult]] = []  # answers to judge, batch_size at a time

    def judge_ended(out) -> None:
        qualities = judge.score([JudgeItem(r.instruction, result.text, r.output) for r, result in ended])
        for (record, result), quality in zip(ended, qualities, strict=True):
            out.append(
                {
                    "id": record.id,
                    "instruction": record.instruction,
                    "annotated": result.annotated,
                    "speedup": result.stats.theoretical_speedup,
                    "num_tokens": result.stats.num_tokens,
                    "num_steps": result.stats.num_steps,
                    "num_threads": result.stats.num_threads,
                    "num_malformed": sum(result.stats.malformed.values()),
                    "text": result.text,
                    "quality": quality,
                    "judge": judge.name,
                    "decoding": decoding,
                }
            )
        ended.clear()

    with store.appender() as out:

        def on_result(i: int, result: DecodeResult) -> None:
            ended.append((todo[i], result))
            if len(ended) == batch_size:
                judge_ended(out)

        if todo:
            prompt_ids = [encode_prompt(tokenizer, r.instruction, r.input) for r in todo]
            # Continuous batching: batch_size prompts at once, the next joining as one ends.
            with torch.inference_mode():
                decode_async(model, tokenizer, prompt_ids, config, policy, max_batch=batch_size, on_result=on_result)
        if ended:
            judge_ended(out)
    ids = [r.id for r in records]
    store.gather(order=ids)
    wanted = set(ids)
    answers = [a for a in store.records() if a["id"] in wanted]
    _judge_again(answers, records, judge, answers_path, processes)
    qualities = [a["quality"] for a in answers if a["quality"] is not None]
    summary = HeldoutSummary(
        num_prompts=len(answers),
        mean_speedup=statistics.fmean(a["speedup"] for a in answers),
        fork_share=sum(a["num_threads"] > 0 for a in answers) / len(answers),
        malformed_per_answer=statistics.fmean(a["num_malformed"] for a in answers),
        quality_proxy=statistics.fmean(qualities) if qualities else None,
        judge=judge.name,
        mean_tokens=mean_of(answers, "num_tokens"),
        mean_steps=mean_of(answers, "num_steps"),
    )
    if processes.is_main:
        write_json_atomic(out_dir / SUMMARY, asdict(summary))
    return summary


def _judge_again(answers: list[dict], records: list[Record], judge, answers_path: Path, processes: Processes) -> None:
    """Score again, in place and in `answers_path`, the answers another judge scored: a check a run took from another
    run under another judge (`stage.candidates_from`), so that one summary never averages two judges. The main
    process judges and writes; the others read its scores back, so each answer is judged once."""
    stale = [a for a in answers if a.get("judge") != judge.name]
    if not stale:
        return
    if processes.is_main:
        outputs = {r.id: r.output for r in records}
        # Answers written before the plain text was kept: the text of their annotation, as the decoder writes it.
        items = [JudgeItem(a["instruction"], a.get("text", strip_annotations(a["annotated"])), outputs[a["id"]])
                 for a in stale]
        for answer, quality in zip(stale, judge.score(items), strict=True):
            answer.update(quality=quality, judge=judge.name)
        log.info("%s: judged %d answers again, by %s", answers_path, len(stale), judge.name)
        judged = {a["id"]: a for a in stale}
        write_jsonl_atomic(answers_path, [judged.get(a["id"], a) for a in read_jsonl(answers_path)])
    processes.wait()
    if not processes.is_main:
        saved = {a["id"]: a for a in read_jsonl(answers_path)}
        for answer in stale:
            answer.update(quality=saved[answer["id"]]["quality"], judge=saved[answer["id"]]["judge"])


def check_saved_answers(answers: list[dict], decoding: dict, answers_path: Path) -> None:
    """Refuse to resume a check whose saved answers were decoded with other settings than `decoding` (this run's,
    through JSON). Answers written before the settings were recorded pass."""
    for answer in answers:
        if "decoding" not in answer:
            continue
        difference = decode_difference(answer["decoding"], decoding)
        if difference is not None:
            name, recorded, asked = difference
            raise PastaError(f"{answers_path} holds answers decoded with {name}={recorded}, this check asks {asked}: "
                             "resume with the run's settings, or pass another output_dir (the saved answers are kept)")


def mean_of(answers: list[dict], key: str) -> float | None:
    """The mean of `key` over the answers, or None when an answer written before it was kept lacks it."""
    values = [a.get(key) for a in answers]
    return None if None in values else statistics.fmean(values)


def read_summary(out_dir: Path) -> HeldoutSummary | None:
    """The summary a finished check wrote in `out_dir`, or None (also when it does not read back: the check is
    then redone from the answers it kept)."""
    path = out_dir / SUMMARY
    if not path.is_file():
        return None
    try:
        return HeldoutSummary(**json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError, UnicodeDecodeError) as exc:  # a torn write, an edit: JSON or fields wrong
        log.warning("%s does not read back (%s): checking again", path, exc)
        return None


class HeldoutCheck:
    """The held-out check of one policy folder (None: the stage's starting model) on `records` (`heldout_records`
    of `stage.heldout_path`; none: no check); a check that finished before a crash is read back, not redone."""

    def __init__(self, cfg: DictConfig, settings: PrefSettings, records: list[Record], judge,
                 policy: ReservationPolicy, processes: Processes):
        self.cfg, self.settings, self.records, self.judge, self.policy = cfg, settings, records, judge, policy
        self.processes = processes

    def num_sampled(self, sampled: list[Record]) -> int:
        """How many check prompts are also prompts a round samples (matched by normalised text): the check is not
        held out on those, and its numbers would flatter the rounds."""
        sampled_prompts = {prompt_key(record.instruction, record.input) for record in sampled}
        return sum(prompt_key(record.instruction, record.input) in sampled_prompts for record in self.records)

    def run(self, policy_path: Path | None, out_dir: Path) -> HeldoutSummary | None:
        if not self.records:
            return None
        summary = read_summary(out_dir)
        if summary is not None and summary.judge == self.judge.name:  # else a check another judge scored
            return summary
        model_cfg = self.cfg.model if policy_path is None else model_at(self.cfg.model, policy_path)
        model, tokenizer = load_model(model_cfg, device=resolve_device(self.cfg.get("device", "auto")),
                                      path_key="model.path" if policy_path is None else None)
        add_tag_tokens(tokenizer, model)
        return check_policy(
            model,
            tokenizer,
            self.records,
            self.judge,
            self.policy,
            self.settings.max_new_tokens,
            self.settings.sample_batch_size,
            out_dir,
            self.processes,
            self.settings.no_repeat_ngram_size,
            self.settings.draft_skeleton,
        )
