"""Write the records SFT would train on from an annotation file, under the stage defaults' promise balance.

SFT keeps only the promise-bearing records, and as many plain ones (a seeded sample), when fewer than half carry a
promise (`data.min_promise_share=0.5`, `data.plain_per_promise=1`; pasta.training.examples.balance_promises). The
data's own statistics (`python -m pasta.lang check`) describe all of it; this subset is what the student sees.

    python scripts/sft_subset.py outputs/shape/mix.jsonl outputs/shape/mix.sft.jsonl
    python -m pasta.lang check outputs/shape/mix.sft.jsonl
"""

from __future__ import annotations

from pasta.cli import run_script
from pasta.data import Record, read_jsonl, write_jsonl_atomic
from pasta.errors import ArgumentParser
from pasta.training.examples import balance_promises


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("annotations", help="an annotation output (.jsonl)")
    parser.add_argument("out", help="where to write the SFT records (.jsonl)")
    parser.add_argument("--min-promise-share", type=float, default=0.5)
    parser.add_argument("--plain-per-promise", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    raw = read_jsonl(args.annotations)
    records = [Record.from_dict(r) for r in raw]
    kept, balance = balance_promises(records, min_promise_share=args.min_promise_share,
                                     plain_per_promise=args.plain_per_promise, seed=args.seed)
    ids = {record.id for record in kept}
    write_jsonl_atomic(args.out, [r for r, record in zip(raw, records, strict=True) if record.id in ids])
    print(balance.message())
    return 0


if __name__ == "__main__":
    run_script(main)
