"""Print a seeded sample of an annotation file's forked records for a hand audit of independence.

Each record is shown as its main thread (chunks as `<P:topic>`) and then each chunk's text, so a reader can ask of
every chunk: could it be written from the prompt, the main thread up to its promise and its topic, without seeing
its siblings? docs/results/teacher-audit.md holds such an audit.

    python -m pasta.annotate data=alpaca_eval_gpt4 output=out/gpt4.jsonl on_reject=keep_unannotated
    python scripts/teacher_audit_sample.py out/gpt4.jsonl --num 30 --seed 0
"""

from __future__ import annotations

import random

from pasta.cli import run_script
from pasta.data import Record, read_jsonl
from pasta.errors import ArgumentParser
from pasta.lang import LangError, Promise, Sync, Text, parse


def forks(record: dict) -> bool:
    try:
        return bool(parse(record.get("annotated") or "").promises)
    except LangError:
        return False


def show(record: dict) -> str:
    doc = parse(record["annotated"])
    skeleton = "".join(item.text if isinstance(item, Text) else "<SYNC>" if isinstance(item, Sync)
                       else f"<P:{item.topic}>" for item in doc.items)
    record_id = Record.from_dict(record).id  # the annotation stage's id, also for files that do not store it
    lines = [f"=== {record_id} | {' '.join(record['instruction'].split())[:200]}", skeleton]
    lines += [f"  [{p.topic}] {p.content!r}" for p in doc.items if isinstance(p, Promise)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="an annotation output (.jsonl)")
    parser.add_argument("--num", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    forked = [r for r in read_jsonl(args.path) if forks(r)]
    random.Random(args.seed).shuffle(forked)
    for record in forked[: args.num]:
        print(show(record), end="\n\n")
    return 0


if __name__ == "__main__":
    run_script(main)
