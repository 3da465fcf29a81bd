"""The sequential baseline: one token per forward, the reference every speedup is measured against.

With greedy sampling it produces exactly `model.generate(do_sample=False)`'s tokens (same eos ids, same
max_new_tokens and stop-string rule; tests/test_decoding.py checks it on the tiny and the embedded model): the
prompts' prefill is generate's (a batch left-padded with a 2-D attention mask and position ids counted from each
prompt's first token, a single prompt with no mask at all, transformers' own attention and linears). Its decode
steps are pasta/decoding/step.py's: one row per request, an additive mask over the cache's slot bucket written from
a preallocated visibility row, the preallocated `SlotCache` written by index (not `DynamicCache`'s concatenation),
so that `decode.compile` reuses one graph; their float rounding may differ from generate's, never by a token in the
tests. It keeps logits for the last row only and drops finished requests from the batch.
Its timings are the asynchronous runner's (`runner.RequestClock`): the prefill, the decode steps after it, and the
bookkeeping inside both. It does not step through `runner.StepBatch`, whose prefill's 4-D visibility mask would
change the float rounding against `generate` (pasta/decoding/plain.py is the sequential request for that batch).
On CPU its decode steps (up to 8 requests) run the multi-row linears of pasta/decoding/linears.py, a single row
included: the same numbers as generate's up to float rounding, about 1.5x faster here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pasta.decoding.attention import grouped_query_sdpa
from pasta.decoding.cache import SlotCache
from pasta.decoding.config import DecodeConfig
from pasta.decoding.linears import multirow_linears
from pasta.decoding.result import DecodeResult, DecodeStats
from pasta.decoding.runner import RequestClock
from pasta.decoding.sampling import choose_tokens, request_generators
from pasta.decoding.step import StepForward, bucket_slots
from pasta.decoding.text import (
    SampledAnswer,
    TextCallback,
    TextStream,
    eos_token_ids,
    pad_token_id,
    settled,
    text_decoder,
)
from pasta.errors import PastaError


@dataclass
class _Rows:
    """The requests still decoding, a batch row each, and what their next forward needs."""

    request_ids: list[int]
    cache: SlotCache
    visible: torch.Tensor  # [B, C] bool: the slots each row sees (not its prompt's left padding), set by index
    num_slots: int  # slots written, the same for every row (left padding evens out the prompts)
    next_position: torch.Tensor  # [B]: position of the token each row feeds next, less one

    def keep(self, indices: list[int]) -> None:
        """Keep these rows, in this order; the others are done."""
        self.request_ids = [self.request_ids[b] for b in indices]
        self.cache.keep(indices)
        index = torch.tensor(indices, device=self.visible.device)
        self.visible, self.next_position = self.visible[index], self.next_position[index]


def _check_inputs(prompt_ids_batch: list[list[int]], forced_ids: list[list[int]] | None) -> None:
    if not prompt_ids_batch or any(not ids for ids in prompt_ids_batch):
        raise PastaError("every prompt needs at least one token")
    if forced_ids is not None and (len(forced_ids) != len(prompt_ids_batch) or any(not ids for ids in forced_ids)):
        raise PastaError("forced_ids needs one non-empty response per prompt")


def _prefill(model, step: StepForward, prompt_ids_batch: list[list[int]], pad_id: int, num_new_slots: int,
             use_mask: bool) -> tuple[_Rows, torch.Tensor]:
    """The prompts, left-padded, in one forward; the rows and the logits [B, V] of each one's first token."""
    device = model.device
    prompt_len = max(len(ids) for ids in prompt_ids_batch)
    input_ids = torch.tensor([[pad_id] * (prompt_len - len(ids)) + ids for ids in prompt_ids_batch], device=device)
    padding_mask = torch.tensor(
        [[0] * (prompt_len - len(ids)) + [1] * len(ids) for ids in prompt_ids_batch], device=device
    )  # [B, S]
    position_ids = (padding_mask.cumsum(-1) - 1).masked_fill_(padding_mask == 0, 1)  # [B, S]
    capacity = bucket_slots(prompt_len + num_new_slots)  # every decode step's slot bucket fits: no regrowth
    cache = SlotCache.for_model(model, capacity, num_rows=len(prompt_ids_batch))
    cache.begin_step([0] * len(prompt_ids_batch), prompt_len, prompt_len, device)
    logits = step.eager(cache, input_ids, position_ids, padding_mask if use_mask else None,
                        logits_to_keep=1)[:, -1]  # [B, V]
    visible = torch.zeros(len(prompt_ids_batch), capacity, dtype=torch.bool, device=device)  # [B, C]
    visible[:, :prompt_len] = padding_mask.bool()
    rows = _Rows(list(range(len(prompt_ids_batch))), cache, visible, prompt_len, position_ids[:, -1])
    return rows, logits


def _decode_step(step: StepForward, rows: _Rows, token_ids: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Feed each row's last token; the logits [B, V] of its next one."""
    device = rows.visible.device
    slot = rows.num_slots
    rows.num_slots += 1
    kv_length = bucket_slots(rows.num_slots)
    rows.cache.begin_step([slot] * len(token_ids), 1, kv_length, device)
    if rows.cache.capacity > rows.visible.shape[1]:
        rows.visible = torch.nn.functional.pad(rows.visible, (0, rows.cache.capacity - rows.visible.shape[1]))
    rows.visible[:, slot] = True
    mask = torch.zeros(len(token_ids), 1, 1, kv_length, dtype=dtype, device=device)
    mask.masked_fill_(~rows.visible[:, None, None, :kv_length], torch.finfo(dtype).min)  # [B, 1, 1, kv]
    rows.next_position = rows.next_position + 1
    return step.decode(
        rows.cache,
        input_ids=torch.tensor(token_ids, device=device)[:, None],  # [B, 1]
        position_ids=rows.next_position[:, None],  # [B, 1]
        attention_mask=mask,
    )[:, -1]  # [B, V]


def _choose(logits: torch.Tensor, rows: _Rows, answers: list[SampledAnswer], config: DecodeConfig,
            generators: list[torch.Generator] | None, forced_ids: list[list[int]] | None) -> list[int]:
    """Each row's next token: the forced response's, or sampled from its logits [B, V]."""
    if forced_ids is not None:
        return [forced_ids[r][len(answers[r].token_ids)] for r in rows.request_ids]
    if generators is None:
        return choose_tokens(logits, config.sampling, None).tolist()
    return [int(choose_tokens(logits[b : b + 1], config.sampling, generators[r])[0])
            for b, r in enumerate(rows.request_ids)]


def _result(answer: SampledAnswer, clock: RequestClock, decode: Callable[[list[int]], str],
            num_prompt_ids: int) -> DecodeResult:
    text = answer.text(decode)
    num_tokens = len(answer.token_ids)
    stats = DecodeStats(num_tokens=num_tokens, num_steps=num_tokens, prefill_s=clock.prefill_s,
                        decode_s=clock.decode_s, wall_s=clock.prefill_s + clock.decode_s,
                        bookkeeping_s=clock.bookkeeping_s, finish_reason=answer.finish_reason,
                        step_rows=[num_prompt_ids] + [1] * (num_tokens - 1))
    return DecodeResult(text=text, annotated=text, token_doc=None, token_ids=answer.token_ids, stats=stats)


@torch.inference_mode()
def decode_sequential(
    model,
    tokenizer,
    prompt_ids_batch: list[list[int]],
    config: DecodeConfig,
    *,
    on_text: TextCallback | None = None,
    seeds: list[int] | None = None,
    forced_ids: list[list[int]] | None = None,
) -> list[DecodeResult]:
    """Decode a batch of prompts one token per step. The answer's tags, if any, are plain tokens here.

    `forced_ids[i]` replays that response for request i instead of sampling (teacher forcing: the benchmark's
    baseline decodes exactly the tokens of the asynchronous run it is compared with).
    """
    _check_inputs(prompt_ids_batch, forced_ids)
    num_requests = len(prompt_ids_batch)
    step_start = time.perf_counter()
    eos_ids = eos_token_ids(model, tokenizer)
    decode = text_decoder(tokenizer)
    answers = [SampledAnswer(len(forced_ids[r]) if forced_ids else config.max_new_tokens, forced_ids is not None)
               for r in range(num_requests)]
    max_stop_len = max((len(s) for s in config.stop_strings), default=0)
    generators = None if forced_ids else request_generators(config.sampling, num_requests, model.device, seeds)
    stream = TextStream(on_text, num_requests) if on_text else None
    clocks = [RequestClock() for _ in range(num_requests)]
    use_mask = num_requests > 1  # a single prompt's prefill runs with no mask at all, as generate's does
    step = StepForward(model, compile=config.compile, mode=config.compile_mode)
    rows, logits = _prefill(model, step, prompt_ids_batch, pad_token_id(tokenizer),
                            max(a.limit for a in answers) + 1, use_mask)
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    first = True
    # Decode steps only: the prompt's prefill above ran on transformers' own linears and attention, as generate's.
    with grouped_query_sdpa(model), multirow_linears(model, enabled=config.cpu_multirow_linears):
        while True:
            chosen = _choose(logits, rows, answers, config, generators, forced_ids)
            bookkeeping_start = time.perf_counter()
            for r, token_id in zip(rows.request_ids, chosen, strict=True):
                answers[r].take(token_id, eos_ids, config.stop_strings, decode)
                if stream:
                    text = decode(answers[r].token_ids)
                    stream.update(r, text if answers[r].finish_reason else settled(text, max_stop_len))
            keep = [b for b, r in enumerate(rows.request_ids) if not answers[r].finish_reason]
            now = time.perf_counter()
            for r in rows.request_ids:
                clocks[r].add_step(now - step_start, now - bookkeeping_start, prefill=first)
            first = False
            if not keep:
                break
            if len(keep) < len(rows.request_ids):
                rows.keep(keep)
                chosen = [chosen[b] for b in keep]
            step_start = time.perf_counter()
            logits = _decode_step(step, rows, chosen, dtype)
    return [_result(answer, clock, decode, len(prompt_ids))
            for answer, clock, prompt_ids in zip(answers, clocks, prompt_ids_batch, strict=True)]
