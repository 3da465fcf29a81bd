"""Where an answer's tokens and decoding steps go, against Baseline-SFT's answer to the same prompt.

A PASTA answer is faster per token but can be slower per answer: wall-clock is steps x cost per step, and steps
follow tokens. This module splits each answer's sampled tokens by what they are, and its steps by what the main
thread did in them, from the run's stats.jsonl (the annotated form re-tokenized structurally with the student's
tokenizer, `pasta.lang.tokenize_document`, so the counts can differ from the sampled ids by a BPE merge):

- content: main-thread text, and chunk text (what a reader sees);
- tags: promise skeleton (`<|promise|>`, `<|promise_tokens|>`, `<|promise_end|>`), topics, counts (the digits of
  `tokens="N"`), `<|async_end|>`, `<|sync|>`, eos;
- overrun: chunk content past its promise's N; repeated: content words inside a word 4-gram that another thread of
  the same answer also writes (a chunk echoing the main thread or a sibling);
- steps (the ideal schedule, `pasta.lang.schedule`): main-thread text steps, main-thread tag steps (promise
  skeleton, topic, count, sync), and waits (the main thread idle at a sync or after eos while chunks finish);
- forced: tokens the constrained decoder found only one legal choice for (`DecodeStats.num_forced`), the steps a
  jump-forward engine (SGLang's compressed grammar) would save by feeding them without a forward;
- kept guesses: main-thread tokens `decode.draft_skeleton` guessed and the model chose (`DecodeStats.num_draft_kept`),
  each a step the main thread did not take: the decode took up to that many fewer steps than the schedule above
  (fewer where the main thread then waited for a chunk anyway).

Baseline-SFT decodes one token a step, so its tokens are its steps: `steps / baseline tokens` is the step ratio
the wall-clock speedup rests on, `content / baseline tokens` the length gap in content.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pasta.decoding.result import BUDGET_CUTS
from pasta.lang import Document, LangError, Promise, Text, TokenDoc, parse, schedule, tokenize_document

_WORD = re.compile(r"\w+")
REPEAT_NGRAM = 4


@dataclass(frozen=True)
class AnswerTokens:
    """One answer's tokens and steps by kind (see the module docstring)."""

    num_main_text: int
    num_chunk_text: int
    num_promise_tags: int  # <|promise|>, <|promise_tokens|>, <|promise_end|>
    num_topic: int
    num_count: int
    num_async_end: int
    num_sync: int
    num_eos: int
    num_overrun: int  # chunk content tokens past the promise's N (counted promises)
    num_words: int  # content words (main text and chunks)
    num_repeated_words: int  # content words in a word 4-gram that another thread of the answer also writes
    num_steps: int
    num_main_text_steps: int  # steps sampling main-thread text or eos
    num_main_tag_steps: int  # steps sampling a tag, topic or count token in the main thread
    num_wait_steps: int  # steps the main thread waited for chunks (at a sync or after eos)
    forked: bool
    num_forced: int = 0  # the decoder's tokens that had one legal choice (jump-forward could skip their steps)
    num_draft_kept: int = 0  # guessed main-thread tokens the model chose (decode.draft_skeleton): steps saved

    @property
    def num_tokens(self) -> int:
        return (self.num_main_text + self.num_chunk_text + self.num_promise_tags + self.num_topic + self.num_count
                + self.num_async_end + self.num_sync + self.num_eos)


def _ngrams(text: str) -> list[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return [tuple(words[i : i + REPEAT_NGRAM]) for i in range(len(words) - REPEAT_NGRAM + 1)]


def repeated_words(segments: Sequence[str]) -> tuple[int, int]:
    """(content words, words covered by a word 4-gram that also occurs in another segment) over the segments."""
    grams = [_ngrams(segment) for segment in segments]
    owners: dict[tuple[str, ...], set[int]] = {}
    for index, segment_grams in enumerate(grams):
        for gram in segment_grams:
            owners.setdefault(gram, set()).add(index)
    num_words = num_repeated = 0
    for index, segment in enumerate(segments):
        num = len(_WORD.findall(segment))
        covered = [False] * num
        for start, gram in enumerate(grams[index]):
            if len(owners[gram]) > 1:
                covered[start : start + REPEAT_NGRAM] = [True] * REPEAT_NGRAM
        num_words += num
        num_repeated += sum(covered)
    return num_words, num_repeated


def answer_tokens(doc: Document, token_doc: TokenDoc, eos_id: int) -> AnswerTokens:
    """The split of one answer: `doc` its parsed form, `token_doc` the same tokenized with eos appended."""
    tags = token_doc.tag_ids
    kinds: Counter[str] = Counter()
    in_topic = in_count = False
    for token_id in token_doc.main_ids:
        if token_id == tags.promise:
            kinds["promise_tags"] += 1
            in_topic = True
        elif token_id == tags.promise_tokens:
            kinds["promise_tags"] += 1
            in_topic, in_count = False, True
        elif token_id == tags.promise_end:
            kinds["promise_tags"] += 1
            in_topic = in_count = False
        elif token_id == tags.sync:
            kinds["sync"] += 1
        elif token_id == eos_id:
            kinds["eos"] += 1
        else:
            kinds["topic" if in_topic else "count" if in_count else "main_text"] += 1
    chunk_text = sum(len(chunk.body_ids) - 1 for chunk in token_doc.chunks)
    overrun = sum(max(0, len(chunk.body_ids) - 1 - chunk.num_predicted) for chunk in token_doc.chunks
                  if chunk.num_predicted is not None)
    main_text_runs = ["".join(item.text for item in doc.items if isinstance(item, Text))]
    chunk_texts = [item.content for item in doc.items if isinstance(item, Promise)]
    num_words, num_repeated = repeated_words(main_text_runs + chunk_texts)
    plan = schedule(token_doc)
    num_main_tag = kinds["promise_tags"] + kinds["topic"] + kinds["count"] + kinds["sync"]
    return AnswerTokens(
        num_main_text=kinds["main_text"],
        num_chunk_text=chunk_text,
        num_promise_tags=kinds["promise_tags"],
        num_topic=kinds["topic"],
        num_count=kinds["count"],
        num_async_end=len(token_doc.chunks),
        num_sync=kinds["sync"],
        num_eos=kinds["eos"],
        num_overrun=overrun,
        num_words=num_words,
        num_repeated_words=num_repeated,
        num_steps=plan.num_steps,
        num_main_text_steps=kinds["main_text"] + kinds["eos"],
        num_main_tag_steps=num_main_tag,
        num_wait_steps=plan.num_steps - len(token_doc.main_ids),
        forked=bool(token_doc.chunks),
    )


def record_tokens(record: dict[str, Any], tokenizer) -> AnswerTokens | None:
    """The split of one stats.jsonl record (its `annotated` form; eos counted when the decode ended on it), or None
    when the annotated form is missing or not PASTA-LANG."""
    try:
        doc = parse(record["annotated"])
        ended = record.get("finish_reason", "eos") == "eos"
        token_doc = tokenize_document(doc, tokenizer, add_eos=ended)
    except (KeyError, TypeError, LangError):
        return None
    answer = answer_tokens(doc, token_doc, tokenizer.eos_token_id if ended else -1)
    return dataclasses.replace(answer, num_forced=int(record.get("num_forced", 0)),
                               num_draft_kept=int(record.get("num_draft_kept", 0)))


@dataclass(frozen=True)
class LengthRow:
    """Means per answer over one group of a run's answers (all, forked or plain), beside Baseline-SFT's."""

    group: str
    num_answers: int
    tokens: float
    content: float
    main_text: float
    chunk_text: float
    promise_tags: float
    topic: float
    count: float
    async_end: float
    sync: float
    eos: float
    overrun: float
    repeated_share: float | None  # repeated content words / content words
    steps: float
    main_text_steps: float
    main_tag_steps: float
    wait_steps: float
    forced: float  # tokens with one legal choice: what jump-forward would save in steps
    draft_kept: float  # guessed main-thread tokens the model chose (decode.draft_skeleton): steps saved
    baseline_tokens: float | None  # Baseline-SFT's tokens (= its steps) on the same prompts
    content_over_baseline: float | None  # total content tokens / total Baseline-SFT tokens
    steps_over_baseline: float | None  # total steps / total Baseline-SFT steps
    num_hit_limit: int  # answers the decoder stopped at max_new_tokens (or max_total_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def length_row(group: str, answers: Sequence[AnswerTokens], baseline_tokens: Sequence[int] | None,
               num_hit_limit: int) -> LengthRow:
    num = len(answers)

    def mean(get: Callable[[AnswerTokens], float]) -> float:
        return sum(get(a) for a in answers) / num if num else 0.0

    content = [a.num_main_text + a.num_chunk_text for a in answers]
    words = sum(a.num_words for a in answers)
    baseline_total = sum(baseline_tokens) if baseline_tokens else 0
    return LengthRow(
        group=group,
        num_answers=num,
        tokens=mean(lambda a: a.num_tokens),
        content=sum(content) / num if num else 0.0,
        main_text=mean(lambda a: a.num_main_text),
        chunk_text=mean(lambda a: a.num_chunk_text),
        promise_tags=mean(lambda a: a.num_promise_tags),
        topic=mean(lambda a: a.num_topic),
        count=mean(lambda a: a.num_count),
        async_end=mean(lambda a: a.num_async_end),
        sync=mean(lambda a: a.num_sync),
        eos=mean(lambda a: a.num_eos),
        overrun=mean(lambda a: a.num_overrun),
        repeated_share=sum(a.num_repeated_words for a in answers) / words if words else None,
        steps=mean(lambda a: a.num_steps),
        main_text_steps=mean(lambda a: a.num_main_text_steps),
        main_tag_steps=mean(lambda a: a.num_main_tag_steps),
        wait_steps=mean(lambda a: a.num_wait_steps),
        forced=mean(lambda a: a.num_forced),
        draft_kept=mean(lambda a: a.num_draft_kept),
        baseline_tokens=baseline_total / num if baseline_tokens and num else None,
        content_over_baseline=sum(content) / baseline_total if baseline_total else None,
        steps_over_baseline=sum(a.num_steps for a in answers) / baseline_total if baseline_total else None,
        num_hit_limit=num_hit_limit,
    )


def run_length(stats: Sequence[dict[str, Any]], tokenizer,
               baseline: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The rows (all, forked, plain) of a run's stats records; `baseline` is Baseline-SFT's stats by instruction,
    whose answers are tokenized the same way (their tokens are their steps)."""
    rows: dict[str, tuple[list[AnswerTokens], list[int], int]] = {g: ([], [], 0) for g in ("all", "forked", "plain")}
    for record in stats:
        answer = record_tokens(record, tokenizer)
        if answer is None:
            continue
        base = None
        if baseline is not None and record["instruction"] in baseline:
            base = record_tokens(baseline[record["instruction"]], tokenizer)
        hit = record.get("finish_reason") in BUDGET_CUTS
        for group in ("all", "forked" if answer.forked else "plain"):
            answers, bases, num_hit = rows[group]
            answers.append(answer)
            if base is not None:
                bases.append(base.num_tokens)
            rows[group] = (answers, bases, num_hit + hit)
    result = []
    for group, (answers, bases, num_hit) in rows.items():
        if not answers:
            continue
        complete = baseline is not None and len(bases) == len(answers)
        result.append(length_row(group, answers, bases if complete else None, num_hit).to_dict())
    return result

