"""What would drafting the promise list's skeleton save? Replays an evaluation's saved answers step by step, no model.

    python scripts/skeleton_draft.py outputs/study/eval-timed/pasta-lambda1-round1 \
        --reference outputs/study/eval/baseline-sft
    python scripts/skeleton_draft.py RUN --reference BASELINE --max-rows 8     # no step over 8 rows

A forked answer spends its main thread's steps on the list it promises: `\\n2.` `<|promise|>` `Set` `<|promise_end|>`,
`\\n3.` `<|promise|>` ..., one token a step. `decode.draft_skeleton=true` feeds a guess of those tokens beside the
main thread's own and keeps the ones the model chooses (pasta/decoding/draft.py): a greedy answer is the same token
for token, in fewer steps. This script says what that would save on a run decoded without it, from its saved
answers alone: each answer's threads are replayed as pasta/decoding/scheduler.py schedules them (a main token sampled
at step s is fed at s + 1; a promise_end sampled at step s opens its chunk at s + 1 when fewer than `max_threads`
run; a sync waits for its group's chunks and feeds their closing tokens), once as decoded and once with the draft
(a step feeds the main thread's pending token and the guess, and samples the guessed tokens that match the answer
and one more).

It prints, for both: the steps per answer, the main thread's sampling steps per forked answer, the theoretical
speedup (tokens / steps), the step speedup against `--reference`'s steps (the sequential Baseline-SFT run of the
same prompts) and the cost-model speedup on the run's own measured step costs (`speed.json`), every one a geomean
over the answers; the "as decoded" row beside the run's own measured numbers says how close the replay is (it
re-tokenizes each saved answer, as pasta.lang.tokenize_document would). An estimate: the guesses' rows cost what
the cost model says a step's rows cost, and nothing else; decoding the run again with `decode.draft_skeleton=true`
measures it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pasta.cli import run_script
from pasta.data import read_jsonl
from pasta.decoding.cost_model import StepCosts
from pasta.decoding.draft import SkeletonDraft
from pasta.decoding.text import text_decoder
from pasta.errors import ArgumentParser, PastaError, one_line
from pasta.lang import LangError, TagIds, TokenDoc, encode_text, parse, tokenize_document
from pasta.measure import geometric_mean


@dataclass(frozen=True)
class Replay:
    """One answer's steps as the scheduler would take them."""

    num_steps: int  # the prefill included
    step_rows: list[int]  # rows fed at each step, the prompt's first
    num_main_steps: int  # steps at which the main thread samples, the prefill included
    num_draft_rows: int  # draft rows fed
    num_accepted: int  # draft tokens the answer took


def in_topic(main_ids: list[int], tags: TagIds) -> bool:
    """The main thread's tokens end inside a promise's topic, after at least one topic token (the decoder's parser
    says so in TOPIC mode)."""
    opened = max((i for i, t in enumerate(main_ids) if t == tags.promise), default=-1)
    return opened >= 0 and all(t not in tags.all for t in main_ids[opened + 1 :]) and opened < len(main_ids) - 1


def replay(doc: TokenDoc, num_prompt_rows: int, draft: SkeletonDraft | None, *, max_threads: int,
           max_rows: int | None = None) -> Replay:
    """`doc`'s steps as decoded (`draft` None) or with the draft, at most `max_rows` rows a step (None: no cap)."""
    tags = doc.tag_ids
    main = doc.main_ids
    openers = [len(c.opener_ids) for c in doc.chunks]
    bodies = [len(c.body_ids) for c in doc.chunks]
    num_forked = 0  # chunks whose promise_end was sampled (from the next step on, each may open)
    started: list[int | None] = []  # the step each chunk opened
    group: list[int] = []  # chunks since the last join
    step_rows = [num_prompt_rows]
    num_sampled, num_main_steps, num_draft_rows, num_accepted = 1, 1, 0, 0
    step = 1
    waiting = False
    main_done = False

    def take(tokens: list[int]) -> None:
        nonlocal num_forked, waiting, main_done
        for token_id in tokens:
            if token_id == tags.promise_end:
                started.append(None)
                group.append(num_forked)
                num_forked += 1
            elif token_id == tags.sync:
                waiting = True
        if num_sampled >= len(main):
            main_done = True

    def chunk_closed(index: int, at: int) -> bool:
        return started[index] is not None and started[index] + bodies[index] - 1 < at

    take(main[:1])
    while True:
        if main_done and all(chunk_closed(c, step + 1) for c in range(num_forked)):
            break
        step += 1
        rows = 0
        running = [c for c in range(num_forked) if started[c] is not None and not chunk_closed(c, step)]
        for c in range(num_forked):  # queued chunks open in promise order while fewer than max_threads run
            if started[c] is None and len(running) < max_threads:
                started[c] = step
                running.append(c)
                rows += openers[c]
        rows += sum(1 for c in running if started[c] < step)
        if waiting:
            if all(chunk_closed(c, step) for c in group):  # the join: the group's closing tokens, then the sync
                rows += len(group) + 1
                group.clear()
                waiting = False
                num_main_steps += 1
                num_sampled += 1
                take(main[num_sampled - 1 : num_sampled])
        elif not main_done:
            guess = draft(main[:num_sampled], in_topic(main[:num_sampled], tags)) if draft is not None else []
            if max_rows is not None:
                guess = guess[: max(0, max_rows - rows - 1)]
            accepted = 0
            while accepted < len(guess) and num_sampled + accepted < len(main) and \
                    main[num_sampled + accepted] == guess[accepted]:
                accepted += 1
            rows += 1 + len(guess)
            num_draft_rows += len(guess)
            num_accepted += accepted
            num_main_steps += 1
            sampled = main[num_sampled : num_sampled + accepted + 1]
            num_sampled += len(sampled)
            take(sampled)
        step_rows.append(rows)
    return Replay(step, step_rows, num_main_steps, num_draft_rows, num_accepted)


@dataclass(frozen=True)
class Answer:
    """One saved answer, re-tokenized, with its reference answer's steps."""

    doc: TokenDoc
    num_prompt_rows: int
    reference_steps: int
    reference_rows: list[int]


def read_run(run: Path) -> tuple[list[dict], dict]:
    """A run folder's per-prompt stats and run.json; a folder that lacks either is a PastaError naming it."""
    stats, info = run / "stats.jsonl", run / "run.json"
    for path in (stats, info):
        if not path.is_file():
            raise PastaError(f"{path}: not found (an evaluation's output_dir holds stats.jsonl and run.json)")
    return list(read_jsonl(stats)), json.loads(info.read_text())


def load_answers(run: Path, records: list[dict], reference: Path, tokenizer) -> list[Answer]:
    """`run`'s answers (its stats `records`) re-tokenized, each with its reference answer's steps; a record without
    the fields an evaluation writes is a PastaError naming its file."""
    try:
        reference_records = {r["instruction"]: r for r in read_run(reference)[0]}
        answers = []
        for record in records:
            ref = reference_records.get(record["instruction"])
            if ref is None:
                raise PastaError(f"{reference}: no answer to {record['instruction'][:60]!r}, which {run} answers: "
                                 "the reference must decode the same prompts")
            doc = tokenize_document(parse(record["annotated"]), tokenizer,
                                    add_eos=record.get("finish_reason") == "eos")
            answers.append(Answer(doc, record["step_rows"][0], ref["num_steps"], ref["step_rows"]))
    except LangError as exc:
        raise PastaError(f"{run}: an answer that does not parse ({exc})") from exc
    except (KeyError, TypeError, IndexError) as exc:
        raise PastaError(f"{run} or {reference}: a stats.jsonl record without an evaluation's fields ({exc!r})") from exc
    if not answers:
        raise PastaError(f"{run}/stats.jsonl: no answer to replay")
    return answers


def summarize(answers: list[Answer], replays: list[Replay], costs: StepCosts | None) -> dict[str, float]:
    forked = [(a, r) for a, r in zip(answers, replays, strict=True) if a.doc.chunks]
    steps = sum(r.num_steps for r in replays)
    row = {
        "forked": len(forked),
        "steps": steps / len(replays),
        "main_steps_per_fork": sum(r.num_main_steps for _, r in forked) / len(forked) if forked else 0.0,
        "theoretical": geometric_mean([a.doc.num_tokens / r.num_steps for a, r in zip(answers, replays, strict=True)]),
        "step_speedup": geometric_mean([a.reference_steps / r.num_steps
                                        for a, r in zip(answers, replays, strict=True)]),
        "draft_rows_per_step": sum(r.num_draft_rows for r in replays) / steps,
        "taken": sum(r.num_accepted for r in replays) / max(1, sum(r.num_draft_rows for r in replays)),
    }
    if costs is not None:
        row["cost_speedup"] = geometric_mean([costs.answer_seconds(a.reference_rows) / costs.answer_seconds(r.step_rows)
                                              for a, r in zip(answers, replays, strict=True)])
    return row


def table(rows: list[tuple[str, dict]]) -> str:
    def cell(row: dict, key: str, fmt: str) -> str:
        return "-" if row.get(key) is None else f"{row[key]:{fmt}}"

    lines = ["| decode | forked | steps (mean) | main-thread steps per fork | theoretical | step speedup | "
             "cost-model speedup | draft rows per step | draft tokens taken |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows:
        lines.append(f"| {name} | {cell(row, 'forked', 'd')} | {cell(row, 'steps', '.1f')} "
                     f"| {cell(row, 'main_steps_per_fork', '.1f')} | {cell(row, 'theoretical', '.3f')} "
                     f"| {cell(row, 'step_speedup', '.3f')} | {cell(row, 'cost_speedup', '.3f')} "
                     f"| {cell(row, 'draft_rows_per_step', '.2f')} | {cell(row, 'taken', '.0%')} |")
    return "\n".join(lines)


def measured_row(speed: dict) -> dict:
    """The run's own speed numbers (its speed.json), beside which the replay is read."""
    value = lambda key: (speed.get(key) or {}).get("value")  # noqa: E731
    return {"theoretical": value("theoretical_speedup_geomean"), "step_speedup": value("step_speedup_geomean"),
            "cost_speedup": value("cost_speedup_geomean"), "forked": speed.get("num_with_threads")}


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an evaluation's output_dir (stats.jsonl, run.json, speed.json)")
    parser.add_argument("--reference", type=Path, required=True,
                        help="the sequential run of the same prompts (Baseline-SFT's output_dir)")
    parser.add_argument("--tokenizer", default=None, help="the model folder to tokenize with (default: run.json's)")
    parser.add_argument("--max-rows", type=int, default=None,
                        help="cut the draft so that no step feeds more rows (default: no cap)")
    args = parser.parse_args(argv)
    if args.max_rows is not None and args.max_rows < 1:
        parser.error(f"--max-rows: {args.max_rows} must be >= 1")
    from transformers import AutoTokenizer

    records, info = read_run(args.run)
    source = args.tokenizer or info.get("model")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as exc:
        raise PastaError(f"{source}: no tokenizer to read ({one_line(str(exc))}); pass --tokenizer") from None
    tag_ids = TagIds.from_tokenizer(tokenizer)
    answers = load_answers(args.run, records, args.reference, tokenizer)
    max_threads = int((info.get("decoding") or {}).get("max_threads", 8))
    speed = json.loads((args.run / "speed.json").read_text()) if (args.run / "speed.json").is_file() else {}
    costs = StepCosts.from_dict(speed["cost_curve"]) if "cost_curve" in speed else None
    draft = SkeletonDraft(tag_ids, text_decoder(tokenizer), lambda text: encode_text(tokenizer, text))
    rows = [("as decoded (measured)", measured_row(speed))]
    for name, guess in (("as decoded (replayed)", None), ("skeleton draft", draft)):
        replays = [replay(a.doc, a.num_prompt_rows, guess, max_threads=max_threads, max_rows=args.max_rows)
                   for a in answers]
        rows.append((name, summarize(answers, replays, costs)))
    print(f"{args.run}: {len(answers)} answers, against {args.reference}; replayed, no model "
          f"(max_threads {max_threads}" + (f", at most {args.max_rows} rows a step)" if args.max_rows else ")"))
    print(table(rows))
    return 0


if __name__ == "__main__":
    run_script(main)
