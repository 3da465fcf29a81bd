"""Write the held-out pool's prompt hashes, in rank order (src/pasta/data/heldout_pool.txt), from the AlpacaEval file.

The pool is `eval.subset=300 eval.subset_seed=0` of AlpacaEval's 805 prompts, chosen by the evaluation's own
`select_subset`; no training stage may see those prompts (pasta/data/heldout.py). Run it only if the selection or
the normalisation ever changes; tests/test_data_heldout.py checks the shipped file against the AlpacaEval file.

    python scripts/heldout_pool.py                       # reads ../shared/data/alpaca_eval.jsonl
    python scripts/heldout_pool.py --alpaca-eval path/to/alpaca_eval.jsonl
"""

from __future__ import annotations

from pathlib import Path

from pasta.cli import run_script
from pasta.config import compose
from pasta.data import check_output_file, load_alpaca_eval, write_text_atomic
from pasta.data.heldout import POOL_FILE, pool_hashes
from pasta.errors import ArgumentParser, PastaError


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alpaca-eval", help="AlpacaEval .jsonl/.json (default: eval_data=alpaca_eval's path)")
    parser.add_argument("--out", type=Path, default=POOL_FILE)
    args = parser.parse_args(argv)
    check_output_file(args.out, "--out")
    if args.alpaca_eval and not Path(args.alpaca_eval).is_file():  # else the loader's error names eval_data.path
        raise PastaError(f"--alpaca-eval={args.alpaca_eval}: no such file")
    overrides = ["eval_data=alpaca_eval"] + ([f"eval_data.path={args.alpaca_eval}"] if args.alpaca_eval else [])
    records = load_alpaca_eval(compose("eval", overrides).eval_data)
    hashes = pool_hashes(records)
    write_text_atomic(args.out, "".join(h + "\n" for h in hashes))
    print(f"wrote {len(hashes)} prompt hashes of {len(records)} AlpacaEval prompts to {args.out}")
    return 0


if __name__ == "__main__":
    run_script(main)
