"""Command-line tools for people writing or debugging PASTA-LANG annotations.

    python -m pasta.lang check data/annotated_examples.jsonl      # validate every record, then summary statistics
    python -m pasta.lang explain 'Tips: <promise topic="a"/>...'  # threads, plain text, per-token layout
    python -m pasta.lang explain --file one.txt --json            # the same, as JSON for machines

`check` reads records with an `annotated` field (inline PASTA-LANG) and, where present, `output` (the original
response, which must equal the plain text). It prints `line N: reason` for each invalid record and exits 1 if any
is invalid, then statistics of the valid ones: the share with promises, promises and chunk lengths, theoretical
speedup, the main thread's tag steps per forked response and cross-thread repetition (pasta.lang.repetition).
Promises are measured in the uncounted form, as the default reservation policy trains them (`--counted`: with
`tokens="N"`). Token counts come from a model's tokenizer: `--tokenizer` takes a model config name (default: the
embedded smollm2-135m) or a local folder.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from pasta.data.jsonl import check_text, read_text_file
from pasta.errors import ArgumentParser, PastaError
from pasta.lang.layout import MAIN_THREAD, PROMPT_THREAD, build_layout
from pasta.lang.repetition import cross_thread_repetition
from pasta.lang.reservation import Reservation, ReservationPolicy
from pasta.lang.schedule import schedule
from pasta.lang.syntax import Document, LangError, parse, plain_text
from pasta.lang.tokens import (
    add_tag_tokens,
    drop_token_counts,
    encode_text,
    fill_token_counts,
    tokenize_document,
    written_counts,
)


def load_tokenizer(name_or_path: str):
    """A tokenizer with the tag tokens: from a local folder, or from a model config name."""
    if Path(name_or_path).is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    else:
        from pasta.config import compose
        from pasta.models import load_tokenizer as load_model_tokenizer

        tokenizer = load_model_tokenizer(compose("generate", [f"model={name_or_path}"]).model)
    add_tag_tokens(tokenizer)
    return tokenizer


def check_record(record: dict, tokenizer) -> tuple[Document | None, str | None]:
    """The record's parsed document, or the reason it is invalid."""
    annotated = record.get("annotated")
    if not isinstance(annotated, str):
        return None, "no `annotated` string field"
    try:
        doc = parse(annotated)
    except LangError as error:
        return None, str(error)
    original = record.get("output")
    if isinstance(original, str) and plain_text(doc) != original:
        return (
            None,
            f"plain text differs from `output` at char {_first_difference(plain_text(doc), original)}",
        )
    # Statistics use measured chunk lengths: a stale or missing tokens= is re-measured by the pipeline anyway.
    return fill_token_counts(doc, tokenizer), None


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _describe(values: list[float]) -> str:
    if not values:
        return "-"
    p90 = sorted(values)[min(len(values) - 1, int(0.9 * len(values)))]
    return (
        f"mean {statistics.mean(values):.2f}, median {statistics.median(values):.2f}, p90 {p90:.2f}, "
        f"max {max(values):.2f}"
    )


def _geomean(values: list[float]) -> str:
    return f"{math.exp(statistics.fmean(math.log(v) for v in values)):.3f}x" if values else "-"


def run_check(path: Path, tokenizer, counted: bool = False) -> int:
    from pasta.data import iter_numbered_jsonl

    num_invalid = 0
    promises_per_response: list[float] = []
    response_tokens: list[float] = []  # of the plain text
    chunk_lengths: list[float] = []
    speedups: list[float] = []
    forked_speedups: list[float] = []
    tag_steps: list[float] = []  # per forked response
    repetition: list[float] = []  # per forked response with content words in its chunks
    num_records = 0
    for line_number, record in iter_numbered_jsonl(path, on_error="fail"):
        num_records += 1
        doc, reason = check_record(record, tokenizer)
        if reason is not None:
            num_invalid += 1
            print(f"line {line_number}: {reason}")
            continue
        promises_per_response.append(len(doc.promises))
        response_tokens.append(len(encode_text(tokenizer, plain_text(doc))))
        chunk_lengths += [p.num_tokens for p in doc.promises]
        plan = schedule(tokenize_document(doc if counted else drop_token_counts(doc), tokenizer))
        speedups.append(plan.theoretical_speedup)
        if doc.promises:
            forked_speedups.append(plan.theoretical_speedup)
            tag_steps.append(plan.num_tag_steps)
            share = cross_thread_repetition(doc).share
            if share is not None:
                repetition.append(share)
    num_valid = num_records - num_invalid
    print(f"{num_records} records, {num_valid} valid, {num_invalid} invalid")
    print(f"with promises: {len(forked_speedups)} of {num_valid} valid ({len(forked_speedups) / max(num_valid, 1):.1%})")
    print(f"response tokens (plain text): {_describe(response_tokens)}")
    print(f"promises per response: {_describe(promises_per_response)}")
    print(f"chunk length (tokens): {_describe(chunk_lengths)}")
    print(f"theoretical speedup:   {_describe(speedups)}; geomean {_geomean(speedups)}, of those with promises "
          f"{_geomean(forked_speedups)} ({'counted' if counted else 'uncounted'} promises)")
    print(f"tag steps per forked response: {_describe(tag_steps)}")
    print(f"cross-thread repetition per forked response: {_describe(repetition)}")
    return 1 if num_invalid else 0


def explain(annotated: str, tokenizer, prompt: str = "", policy: ReservationPolicy | None = None) -> dict:
    """Threads, plain text, schedule and per-token layout of one annotated response, as a JSON-able dict: its
    promises written as training data under `policy` writes them (counted in `tokenizer`'s tokens, or uncounted)."""
    policy = policy or ReservationPolicy()
    doc = written_counts(parse(annotated), tokenizer, policy.counts)
    token_doc = tokenize_document(doc, tokenizer)
    prompt_ids = encode_text(tokenizer, prompt)
    layout = build_layout(prompt_ids, token_doc, policy)
    plan = schedule(token_doc)

    def thread_name(thread: int) -> str:
        if thread == PROMPT_THREAD:
            return "prompt"
        return "main" if thread == MAIN_THREAD else f"chunk {thread}"

    tokens = []
    for row, token_id in enumerate(layout.input_ids):
        visible_threads = sorted(
            {thread_name(layout.thread_ids[c]) for c in layout.visible[row].nonzero().flatten().tolist()}
        )
        target = layout.target_ids[row]
        tokens.append(
            {
                "row": row,
                "token": tokenizer.convert_ids_to_tokens(token_id),
                "thread": thread_name(layout.thread_ids[row]),
                "position": layout.position_ids[row],
                "trained_target": None if target < 0 else tokenizer.convert_ids_to_tokens(target),
                "num_visible": int(layout.visible[row].sum()),
                "sees": visible_threads,
            }
        )
    return {
        "plain_text": plain_text(doc),
        "threads": [{"thread": "main", "num_tokens": len(token_doc.main_ids)}]
        + [
            {
                "thread": f"chunk {i + 1}",
                "topic": p.topic,
                "tokens_attr": p.num_tokens,
                "num_tokens": len(c.body_ids),
            }
            for i, (p, c) in enumerate(zip(doc.promises, token_doc.chunks, strict=True))
        ],
        "num_tokens": plan.num_tokens,
        "num_steps": plan.num_steps,
        "theoretical_speedup": plan.theoretical_speedup,
        "reservation": policy.__dict__,
        "tokens": tokens,
    }


def print_explanation(info: dict) -> None:
    print(f"plain text: {info['plain_text']!r}")
    for thread in info["threads"]:
        counted = "" if thread.get("tokens_attr") is None else f" tokens={thread['tokens_attr']}"
        topic = f"  topic={thread['topic']!r}{counted}" if "topic" in thread else ""
        print(f"{thread['thread']:>9}: {thread['num_tokens']} sampled tokens{topic}")
    print(
        f"{info['num_tokens']} tokens in {info['num_steps']} steps: theoretical speedup "
        f"{info['theoretical_speedup']:.2f}x"
    )
    print(f"{'row':>4} {'thread':>8} {'pos':>5} {'token':<20} {'trained target':<20} sees")
    for t in info["tokens"]:
        target = t["trained_target"] or "-"
        print(
            f"{t['row']:>4} {t['thread']:>8} {t['position']:>5} {t['token']!s:<20.20} {target!s:<20.20} {', '.join(t['sees'])}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m pasta.lang", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="smollm2-135m", help="model config name or local folder")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a JSONL file of annotated records")
    check.add_argument("path", type=Path)
    check.add_argument("--counted", action="store_true", help='measure promises with tokens="N" (default: uncounted)')
    show = commands.add_parser("explain", help="threads, plain text and per-token layout of one response")
    show.add_argument("text", nargs="?", help="inline PASTA-LANG (or use --file; - reads stdin)")
    show.add_argument("--file", type=Path)
    show.add_argument("--prompt", default="", help="prompt text placed before the response")
    default = ReservationPolicy()  # the flags' defaults are the stages' (lang.reservation)
    show.add_argument("--policy", default=default.policy.value, choices=[r.value for r in Reservation],
                      help="reservation policy (default: %(default)s, as training)")
    show.add_argument("--scale", type=float, default=default.scale)
    show.add_argument("--multiple", type=int, default=default.multiple)
    show.add_argument("--fixed", type=int, default=default.fixed)
    show.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            if not args.path.is_file():
                raise PastaError(f"file not found: {args.path}")
            return run_check(args.path, load_tokenizer(args.tokenizer), counted=args.counted)
        if args.file is not None:
            text = read_text_file(args.file)
        elif args.text in (None, "-"):
            text = check_text(sys.stdin.buffer.read().decode("utf-8", errors="surrogateescape"), "<stdin>")
        else:
            text = check_text(args.text, "the text argument")
        try:
            policy = ReservationPolicy(args.policy, scale=args.scale, multiple=args.multiple, fixed=args.fixed)
        except ValueError as exc:  # "<field>: <why>", and the fields are the flags
            raise PastaError(f"--{exc}") from None
        info = explain(text, load_tokenizer(args.tokenizer), prompt=args.prompt, policy=policy)
        if args.json:
            print(json.dumps(info, indent=2, ensure_ascii=False))
        else:
            print_explanation(info)
        return 0
    except (PastaError, OSError) as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
