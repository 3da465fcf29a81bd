"""Choosing the next token from logits: greedy, or temperature with top-k / top-p, one seeded generator per request.

Each request draws from its own `torch.Generator`, and its rows are drawn in a fixed order (the main thread, then
its chunks in fork order), so a request decodes the same tokens alone or inside a batch.
transformers' logits processors work on [batch, vocab] rows of one generation loop and one global RNG; the decoder
samples a varying number of rows per request per step, so the few lines below stand in for them.

`choose_legal_tokens` is the constrained choice (`decode.constrain`): the model's own choice stands whenever it is
legal, so plain text decodes exactly as unconstrained, and only a row whose choice a constraint forbids is masked
and chosen again. Greedy, that is the argmax over the legal tokens. Sampled, the redraw comes from the legal
tokens' renormalised distribution; with temperature alone the result is distributed exactly as a draw from the
masked logits (a draw, kept when legal, else a draw from the legal part), while with top-k / top-p the first draw
is filtered over the whole vocabulary and the redraw over the legal tokens only.
"""

from __future__ import annotations

import torch

from pasta.decoding.config import SamplingConfig
from pasta.decoding.grammar import Constraint


def request_generators(config: SamplingConfig, num_requests: int, device: torch.device | str,
                       seeds: list[int] | None = None) -> list[torch.Generator] | None:
    """One generator per request (None when greedy): `seeds[i]`, else `config.seed + i`, else torch's global RNG."""
    if config.greedy:
        return None
    if seeds is None:
        base = config.seed if config.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        seeds = [base + i for i in range(num_requests)]
    if len(seeds) != num_requests:
        raise ValueError(f"{len(seeds)} seeds for {num_requests} requests")
    return [torch.Generator(device=device).manual_seed(seed) for seed in seeds]


def filter_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as transformers' warpers apply them; removed tokens get -inf."""
    scores = logits.float() / config.temperature  # [N, V]
    if config.top_k and config.top_k < scores.shape[-1]:
        kth = torch.topk(scores, config.top_k, dim=-1).values[..., -1:]  # [N, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)  # [N, V]
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)  # [N, V]
        drop_sorted = cumulative <= 1 - config.top_p
        drop_sorted[..., -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def repeated_ngram_tokens(history: list[int], n: int) -> set[int]:
    """The tokens that would complete, after `history`, an n-gram `history` already holds."""
    if n < 1 or len(history) < n - 1:
        return set()
    prefix = tuple(history[len(history) - n + 1 :])  # n = 1: the empty prefix, every token so far
    return {history[i + n - 1] for i in range(len(history) - n + 1) if tuple(history[i : i + n - 1]) == prefix}


def ban_repeated_ngrams(logits: torch.Tensor, histories: list[list[int]], n: int,
                        exempt_ids: frozenset[int]) -> torch.Tensor:
    """`logits` [N, V] with -inf where a token would repeat an n-gram of its row's history (`exempt_ids`, the tags
    and eos, are never banned: a thread can always close, fork or end). A copy when anything is banned."""
    banned = [(row, token_id) for row, history in enumerate(histories)
              for token_id in repeated_ngram_tokens(history, n) - exempt_ids]
    if not banned:
        return logits
    rows, token_ids = zip(*banned, strict=True)
    logits = logits.clone()
    logits[list(rows), list(token_ids)] = float("-inf")
    return logits


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` [N, V] -> [N], by inverting the row's cumulative distribution at a uniform draw
    (one number per row from `generator`). Not torch.multinomial: for one sample it draws an exponential per
    vocabulary entry through the generator and takes the argmax of probs / draws, which on CPU costs several times
    the inversion (docs/results/benchmarks.md, "Sampling")."""
    rows = probs.double()  # float64: 49K float32 sums drift by more than a rare token's mass
    # Row by row: a cumsum over several rows takes ATen's parallel path, which on a 2-core CPU costs more than the rows.
    cdf = torch.stack([row.cumsum(dim=0) for row in rows])  # [N, V]
    total = cdf[:, -1]  # [N]
    if not bool(((total > 0) & total.isfinite()).all()):  # torch.multinomial refuses such a row too
        raise ValueError("a row of probabilities with no token to draw (all zero, inf or nan)")
    uniform = torch.rand(probs.shape[0], 1, generator=generator, dtype=cdf.dtype, device=cdf.device)  # [N, 1]
    # right=True: the first index whose cumulative mass exceeds the draw, which a zero-probability token never is.
    token_ids = torch.searchsorted(cdf, uniform * total[:, None], right=True).squeeze(-1)  # [N]
    past_end = token_ids >= probs.shape[-1]  # [N]: a draw rounded up to the total, past every cumulative mass
    if bool(past_end.any()):
        token_ids[past_end] = (rows[past_end] > 0).cumsum(dim=-1).argmax(dim=-1)  # the last possible token
    return token_ids


def choose_tokens(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """The next token of each row of `logits` [N, V] -> [N]; rows are drawn in order from `generator`."""
    if config.greedy:
        return logits.argmax(dim=-1)
    return draw(filter_logits(logits, config).softmax(dim=-1), generator)  # softmax: [N, V]


def choose_legal_tokens(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None,
                        constraints: list[Constraint]) -> tuple[list[int], list[str]]:
    """Tokens as `choose_tokens` picks them, except where `constraints[i]` forbids row i's: that row chooses again
    among its allowed tokens. Returns the token ids and the kind of each replaced choice (in row order)."""
    token_ids = choose_tokens(logits, config, generator)  # [N]
    allowed = torch.stack([c.allowed for c in constraints])  # [N, V]
    illegal = ~allowed.gather(1, token_ids[:, None]).squeeze(1)  # [N]
    if not bool(illegal.any()):
        return token_ids.tolist(), []
    redo = illegal.nonzero().squeeze(1)  # [M]
    kinds = [constraints[i].violation(int(token_ids[i])) for i in redo.tolist()]
    masked = logits[redo].masked_fill(~allowed[redo], float("-inf"))  # [M, V]
    token_ids[redo] = choose_tokens(masked, config, generator)
    return token_ids.tolist(), kinds
