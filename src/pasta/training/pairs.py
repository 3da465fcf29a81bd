"""Preference pairs from scored candidates: combined score, best vs worst per prompt, ties skipped.

The paper scores each sampled answer by speed + lambda * quality, where speed is the decoder's theoretical speedup
(tokens / decoding steps) and quality the judge's score; lambda = inf ranks by quality alone. The theoretical
speedup grows with an answer's own length (more chunks, more tokens per step), which the evaluation's wall-clock
speedup does not reward: a longer answer takes more steps. So by default speed is latency, the reference answer's
tokens (the steps a sequential decode of it takes) over the candidate's steps (`stage.speed_reward`). The best and the worst
candidate of a prompt make its pair; a prompt whose candidates all score the same teaches nothing and is skipped.
With `stage.pair_length_tolerance` the worst is taken among the candidates about as long as the best: a pair of a
short and a long answer teaches "be short" at any lambda, one at equal length can only teach what else differs,
forking among it.
With `stage.quality_floor` a chosen side is never an answer the judge scores below its prompt's median candidate
(the rule `forking.jsonl`'s records follow), and the rejected side of best vs worst never one it scores above the
chosen: at lambda 1 the speed reward's spread outweighs the judge's, and without the floor many chosen forks are
judged below their prompt's median (docs/results/study.md), pairs that teach a fast answer over a better one.
With `stage.rejected_side=untagged` a pair teaches nothing but the structure: the prompt's best forked candidate
against its own words without tags, decoded sequentially (re-encoded as plain text, so its steps are its tokens).
Both sides say the same thing at the same length; what differs is the promise tokens and the chunks' layout, the
few tokens a best-vs-worst pair spreads its signal over among all the others. The pair is made only when the fork
scores above its untagged words: a fork whose tags cost more steps than its chunks save is not taught, and at
lambda = inf (quality only) the two tie. With `stage.rejected_side=both` each prompt gives both pairs: the
untagged one for the structure, best vs worst (at equal length with `stage.pair_length_tolerance`) for what an
answer says, which untagged pairs alone give no signal on.
`make_pairs` reads the prompts' records of `scores.jsonl` (pasta.training.sampling) and writes each side with its
scores, the judge's name, its text and its thread ids; `summarize` puts a round's samples and pairs in numbers.
`record_pairs` makes untagged pairs from annotated records without sampling or scoring: the fixed pairs a benchmark
or a test trains the preference trainer on.

A candidate whose decode had malformed PASTA-LANG ranks below every well-formed one, whatever its score: its
training sequence is the decoder's cleaned version of what was sampled, a sequence the policy never wrote, and
a garbled fork can out-score a clean answer on speed (measured on the tiny model: a speed-only round picked a
malformed fork with log-prob -62 over a clean answer with -6 and made sampling worse). So it is never the chosen
side, and it is the rejected side when the prompt has one: the pair then teaches away from broken structure.
With `stage.chosen_must_end` an answer its budget cut ranks the same way: a chosen side is always an answer that
ended by itself. A cut answer is a long one, and as the chosen side it teaches the length the budget cuts (how often
the CPU study's rounds chose one: docs/results/study.md).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pasta.data import Record
from pasta.errors import PastaError
from pasta.training.candidates import Candidate, Pair, PairSide, ScoredPrompt, ThreadIds
from pasta.training.config import RejectedSide, SpeedReward
from pasta.training.examples import build_sft_examples


@dataclass(frozen=True)
class Scored:
    """One candidate's rewards."""

    speed: float  # the speed reward (speed_score)
    quality: float  # the judge's score in [0, 1]
    num_malformed: int = 0  # malformed-output events of the candidate's decode (see the module docstring)
    num_chars: int = 0  # the answer's plain text, tags aside (what a length tolerance compares)
    ended: bool = True  # the answer ended by itself, not cut by its budget


def combined_score(candidate: Scored, quality_weight: float) -> float:
    """speed + quality_weight * quality; quality alone when quality_weight is inf."""
    if math.isinf(quality_weight):
        return candidate.quality
    return candidate.speed + quality_weight * candidate.quality


def speed_score(candidate: Candidate, reference_num_tokens: int | None, reward: SpeedReward) -> float:
    """The candidate's speed: its theoretical speedup, the reference's tokens over its own steps (latency), or
    the smaller of the two (latency_capped: an answer shorter than the reference earns nothing for its brevity)."""
    if reward == SpeedReward.theoretical:
        return candidate.speedup
    if not reference_num_tokens:
        raise PastaError(
            f"stage.speed_reward={reward} needs each prompt's reference answer length, which this scores.jsonl "
            "lacks (written before it was recorded): resample the round, or set stage.speed_reward=theoretical"
        )
    latency = reference_num_tokens / max(candidate.num_steps, 1)
    if reward == SpeedReward.latency_capped:  # min(tokens, reference tokens) / steps
        return min(latency, candidate.speedup)
    return latency


def may_be_chosen(candidate: Scored | Candidate, chosen_must_end: bool) -> bool:
    """Well-formed, and ended by itself when `chosen_must_end`: a candidate that may be a pair's chosen side."""
    return candidate.num_malformed == 0 and (candidate.ended or not chosen_must_end)


def best_and_worst(candidates: list[Scored], quality_weight: float, length_tolerance: float | None = None,
                   quality_floor: float | None = None, chosen_must_end: bool = False) -> tuple[int, int] | None:
    """Indices of the best and the worst candidate, or None when they tie (or fewer than two were scored).

    Well-formed candidates rank above malformed ones (see the module docstring); a prompt with no well-formed
    candidate makes no pair. Among equal ranks the earliest candidate is taken, so the choice is reproducible.
    With `length_tolerance`, the worst is one of the candidates whose text is within that fraction of the best's
    length (`num_chars`). With `quality_floor`, the best is one of the candidates of that quality or more, and the
    worst one of no more quality than the best's, or a malformed one (its pair teaches the structure). With
    `chosen_must_end`, a candidate its budget cut ranks as a malformed one does.
    """
    if len(candidates) < 2:
        return None
    usable = [may_be_chosen(c, chosen_must_end) for c in candidates]
    ranks = [(ok, combined_score(c, quality_weight)) for ok, c in zip(usable, candidates, strict=True)]
    above = [i for i, c in enumerate(candidates) if quality_floor is None or c.quality >= quality_floor]
    if not above:
        return None
    best = max(above, key=lambda i: (ranks[i], -i))
    pool = range(len(ranks))
    if length_tolerance is not None:
        reach = length_tolerance * candidates[best].num_chars
        pool = [i for i in pool if abs(candidates[i].num_chars - candidates[best].num_chars) <= reach]
    if quality_floor is not None:
        pool = [i for i in pool if not usable[i] or candidates[i].quality <= candidates[best].quality]
    worst = min(pool, key=lambda i: (ranks[i], i))
    if ranks[best] == ranks[worst] or not ranks[best][0]:
        return None
    return best, worst


def median_quality(entry: ScoredPrompt) -> float:
    """The judge's score of the prompt's median candidate: the floor of `stage.quality_floor` and of the forks
    `forking.jsonl` keeps (pasta.training.feedback)."""
    return statistics.median(c.quality for c in entry.candidates)


def json_number(value: float) -> float | str:
    """inf as the string "inf": JSON has no infinity."""
    return "inf" if math.isinf(value) else value


def scored_of(candidate: Candidate, entry: ScoredPrompt, reward: SpeedReward) -> Scored:
    return Scored(speed_score(candidate, entry.reference_num_tokens, reward), candidate.quality,
                  candidate.num_malformed, len(candidate.text), candidate.ended)


def pair_side(candidate: Candidate, scored: Scored, index: int, quality_weight: float) -> PairSide:
    """One side of a pair: the candidate's scores (with the judge's name), its text and its thread ids."""
    return PairSide(
        index=index,
        score=combined_score(scored, quality_weight),
        num_malformed=candidate.num_malformed,
        speed=scored.speed,
        speedup=candidate.speedup,
        quality=candidate.quality,
        judge=candidate.judge,
        text=candidate.text,
        annotated=candidate.annotated,
        tokens=candidate.tokens,
        num_tokens=candidate.num_tokens,
    )


def untagged(candidate: Candidate, plain_ids: Callable[[str, bool], list[int]]) -> Candidate:
    """`candidate`'s words as a sequential answer: its text encoded by `plain_ids(text, ended)` (eos appended when
    `ended`, as the candidate's own main thread has it), one token a step."""
    ids = plain_ids(candidate.text, candidate.ended)
    tokens: ThreadIds = {"main_ids": ids, "opener_ids": [], "body_ids": [], "num_predicted": []}
    return dataclasses.replace(candidate, annotated=candidate.text, speedup=1.0, num_tokens=len(ids),
                               num_steps=len(ids), malformed={}, tokens=tokens)


def best_forked(candidates: list[Candidate], scores: list[Scored], quality_weight: float,
                quality_floor: float | None = None, chosen_must_end: bool = False) -> int | None:
    """Index of the best well-formed candidate that forked (the earliest among equals), of `quality_floor` or more
    when given, one that ended by itself with `chosen_must_end`, or None."""
    forked = [i for i, c in enumerate(candidates) if may_be_chosen(c, chosen_must_end) and c.forked
              and (quality_floor is None or c.quality >= quality_floor)]
    return max(forked, key=lambda i: (combined_score(scores[i], quality_weight), -i), default=None)


def untagged_pair(entry: ScoredPrompt, scores: list[Scored], quality_weight: float, reward: SpeedReward,
                  plain_ids: Callable[[str, bool], list[int]], quality_floor: float | None = None,
                  chosen_must_end: bool = False) -> Pair | None:
    """The prompt's best forked candidate (of `quality_floor` or more, ended by itself with `chosen_must_end`)
    against its own words untagged, or None when no candidate forked."""
    best = best_forked(entry.candidates, scores, quality_weight, quality_floor, chosen_must_end)
    if best is None:
        return None
    plain = untagged(entry.candidates[best], plain_ids)
    return pair_of(entry, quality_weight, pair_side(entry.candidates[best], scores[best], best, quality_weight),
                   pair_side(plain, scored_of(plain, entry, reward), best, quality_weight))


def pair_of(entry: ScoredPrompt, quality_weight: float, chosen: PairSide, rejected: PairSide) -> Pair:
    return Pair(id=entry.id, instruction=entry.instruction, judge=entry.judge,
                quality_weight=json_number(quality_weight), prompt_ids=entry.prompt_ids, chosen=chosen,
                rejected=rejected)


def make_pairs(scored: list[ScoredPrompt], quality_weight: float, reward: SpeedReward,
               length_tolerance: float | None = None, rejected_side: RejectedSide = RejectedSide.worst,
               plain_ids: Callable[[str, bool], list[int]] | None = None,
               quality_floor: bool = False, chosen_must_end: bool = False) -> tuple[list[Pair], Counter]:
    """Pairs of the scored prompts and the count of pairs not made, by reason: best vs worst (the worst within
    `length_tolerance` of the best's length, when given), with `rejected_side=untagged` the best fork vs its own
    words untagged (`plain_ids` encodes them; see the module docstring), with `both` each prompt's two pairs; with
    `quality_floor`, no chosen side below its prompt's median candidate in quality; with `chosen_must_end`, no
    chosen side its budget cut (see the module docstring)."""
    pairs: list[Pair] = []
    skipped: Counter = Counter()
    for entry in scored:
        if entry.status != "scored":
            skipped[entry.status] += 1
            continue
        candidates = [scored_of(c, entry, reward) for c in entry.candidates]
        floor = median_quality(entry) if quality_floor else None
        if rejected_side in (RejectedSide.untagged, RejectedSide.both):
            pair = untagged_pair(entry, candidates, quality_weight, reward, plain_ids, floor, chosen_must_end)
            if pair is None:
                if best_forked(entry.candidates, candidates, quality_weight) is None:
                    skipped["no_fork"] += 1
                elif best_forked(entry.candidates, candidates, quality_weight, None, chosen_must_end) is None:
                    skipped["fork_cut"] += 1
                else:
                    skipped["fork_below_quality_floor"] += 1
            elif pair.chosen.score <= pair.rejected.score:
                # the same words judged the same: only speed separates them, and a fork whose tags cost more steps
                # than its chunks save is slower (or, at lambda inf, speed has no weight)
                skipped["fork_not_better"] += 1
            else:
                pairs.append(pair)
        if rejected_side == RejectedSide.untagged:
            continue
        chosen = best_and_worst(candidates, quality_weight, length_tolerance, floor, chosen_must_end)
        if chosen is None:
            if floor is not None and best_and_worst(candidates, quality_weight, length_tolerance, None,
                                                    chosen_must_end) is not None:
                skipped["below_quality_floor"] += 1
            elif length_tolerance is not None and best_and_worst(candidates, quality_weight, None, None,
                                                                 chosen_must_end) is not None:
                skipped["no_length_match"] += 1
            elif not any(c.num_malformed == 0 for c in candidates):
                skipped["all_malformed"] += 1
            elif not any(may_be_chosen(c, chosen_must_end) for c in candidates):
                skipped["all_cut"] += 1
            else:
                skipped["tie"] += 1
            continue
        best, worst = chosen
        pairs.append(pair_of(entry, quality_weight,
                             pair_side(entry.candidates[best], candidates[best], best, quality_weight),
                             pair_side(entry.candidates[worst], candidates[worst], worst, quality_weight)))
    return pairs, skipped


def record_pairs(records: list[Record], tokenizer: Any, max_length: int, judge: str) -> list[Pair]:
    """Each record's annotated answer (chosen) against its own words untagged (rejected), both sides unscored, each
    cut to `max_length` rows as SFT cuts them."""
    options = {"max_length": max_length, "too_long": "truncate"}
    annotated, _ = build_sft_examples(records, tokenizer, strip_annotations=False, **options)
    plain, _ = build_sft_examples(records, tokenizer, strip_annotations=True, **options)

    def side(example: dict[str, Any]) -> PairSide:
        tokens = {key: example[key] for key in ("main_ids", "opener_ids", "body_ids", "num_predicted")}
        return PairSide(index=0, score=0.0, num_malformed=0, speed=1.0, speedup=1.0, quality=None, judge=judge,
                        text="", annotated="", tokens=tokens)

    return [Pair(id=str(i), instruction="", judge=judge, quality_weight=1.0, prompt_ids=a["prompt_ids"],
                 chosen=side(a), rejected=side(p)) for i, (a, p) in enumerate(zip(annotated, plain, strict=True))]


def samples_mean_length_ratio(scored: list[ScoredPrompt]) -> float | None:
    """Every scored candidate's tokens over its prompt's reference answer's, averaged (None without references): what
    the chosen sides' length is compared with, whatever the reward and lambda that pair them."""
    ratios = [c.num_tokens / e.reference_num_tokens for e in scored if e.status == "scored" and e.reference_num_tokens
              for c in e.candidates]
    return statistics.fmean(ratios) if ratios else None


def summarize(scored: list[ScoredPrompt], pairs: list[Pair], skipped: Counter, quality_weight: float,
              reward: SpeedReward) -> dict[str, Any]:
    """Mean speed and quality of the samples and of the chosen and rejected sides (a round's `metrics.json`)."""
    entries = [e for e in scored if e.status == "scored"]
    samples = [c for e in entries for c in e.candidates]
    rewards = [scored_of(c, e, reward) for e in entries for c in e.candidates]
    by_id = {e.id: e for e in entries}

    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None

    def length_ratios(side: str) -> list[float]:
        """Each pair's chosen (or rejected) answer's tokens over its prompt's reference answer's."""
        ratios = []
        for pair in pairs:
            entry = by_id[pair.id]
            if entry.reference_num_tokens:
                ratios.append(getattr(pair, side).num_tokens / entry.reference_num_tokens)
        return ratios

    return {
        "num_prompts": len(scored),
        "num_pairs": len(pairs),
        "skipped": dict(sorted(skipped.items())),
        "num_samples_scored": len(samples),
        "speed_reward": str(reward),
        "mean_speed": mean([r.speed for r in rewards]),
        "mean_speedup": mean([c.speedup for c in samples]),
        "mean_tokens": mean([c.num_tokens for c in samples]),
        "mean_steps": mean([c.num_steps for c in samples]),
        "mean_quality": mean([c.quality for c in samples]),
        "mean_score": mean([combined_score(r, quality_weight) for r in rewards]),
        "num_samples_malformed": sum(c.num_malformed > 0 for c in samples),
        "num_rejected_malformed": sum(p.rejected.num_malformed > 0 for p in pairs),
        "chosen_mean_speed": mean([p.chosen.speed for p in pairs]),
        "chosen_mean_speedup": mean([p.chosen.speedup for p in pairs]),
        "chosen_mean_quality": mean([p.chosen.quality for p in pairs]),
        "rejected_mean_speed": mean([p.rejected.speed for p in pairs]),
        "rejected_mean_speedup": mean([p.rejected.speedup for p in pairs]),
        "rejected_mean_quality": mean([p.rejected.quality for p in pairs]),
        # Whether the pairs teach forking, and length: a round whose chosen sides fork no more often than its
        # rejected ones cannot raise the fork rate, whatever their speed scores.
        "chosen_num_forked": sum(p.chosen.forked for p in pairs),
        "rejected_num_forked": sum(p.rejected.forked for p in pairs),
        # Sides its budget cut: a chosen one teaches the length the budget cuts (stage.chosen_must_end).
        "chosen_num_cut": sum(not by_id[p.id].candidates[p.chosen.index].ended for p in pairs),
        "rejected_num_cut": sum(not by_id[p.id].candidates[p.rejected.index].ended for p in pairs),
        # Against the samples' own length: chosen sides shorter than the samples they were chosen from teach
        # brevity through the SFT half of the loss, even when each pair's sides are equally long.
        "samples_mean_length_ratio": samples_mean_length_ratio(scored),
        "chosen_mean_length_ratio": mean(length_ratios("chosen")),
        "rejected_mean_length_ratio": mean(length_ratios("rejected")),
        "mean_score_margin": mean([p.chosen.score - p.rejected.score for p in pairs]),
    }
