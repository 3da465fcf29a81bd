"""Time the sampler's draw against `torch.multinomial`, side by side, on rows of a model's vocabulary size.

    python scripts/bench_sampling.py                          # SmolLM2's 49,152 tokens + the 7 tags, 2 threads
    python scripts/bench_sampling.py --vocab 151936 --rows 8  # Qwen2.5's vocabulary, a step of 8 sampled rows

A sampled decoding step draws each request's rows from that request's own generator (pasta/decoding/sampling.py).
Both arms draw `--rows` tokens from the same softmaxed random logits with a seeded `torch.Generator`, the way
`choose_tokens` calls them; the arms alternate (`pasta.measure.median_ratio`), so a slow spell of the machine
falls on both. It prints each arm's median milliseconds per call and the ratio. Timings on a shared machine are
noisy: run it alone.
"""

from __future__ import annotations

import statistics
import time

import torch

from pasta.decoding.sampling import draw
from pasta.errors import ArgumentParser
from pasta.measure import median_ratio


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49_159, help="vocabulary size (SmolLM2 with the tag tokens)")
    parser.add_argument("--rows", type=int, default=1, help="rows drawn per call (one request's sampled threads)")
    parser.add_argument("--calls", type=int, default=200, help="calls timed per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats of both arms")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    logits = torch.randn(args.rows, args.vocab, generator=torch.Generator().manual_seed(0))  # [rows, V]
    probs = logits.softmax(dim=-1)
    generator = torch.Generator().manual_seed(1)

    def timed(sample) -> float:
        sample()  # warm-up
        start = time.perf_counter()
        for _ in range(args.calls):
            sample()
        return (time.perf_counter() - start) / args.calls

    ratio, multinomial_s, draw_s = median_ratio(
        lambda: timed(lambda: torch.multinomial(probs, num_samples=1, generator=generator)),
        lambda: timed(lambda: draw(probs, generator)),
        args.repeats,
    )
    print(f"{args.rows} row(s) of {args.vocab} tokens, {args.threads} threads: torch.multinomial "
          f"{statistics.median(multinomial_s) * 1e3:.3f} ms, draw {statistics.median(draw_s) * 1e3:.3f} ms a call: "
          f"draw {ratio:.1f}x as fast (median of {args.repeats} alternating repeats)")


if __name__ == "__main__":
    main()
