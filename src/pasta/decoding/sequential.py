"""The sequential baseline: one token per forward, the reference every speedup is measured against.

With greedy sampling it produces exactly `model.generate(do_sample=False)`'s tokens (same eos ids, same
max_new_tokens and stop-string rule; tests/test_decoding.py checks it): a batch is left-padded with a
2-D attention mask and position ids counted from each prompt's first token, as `generate` does, and a single
prompt runs with no mask at all, as `generate` ends up doing. It writes into the preallocated `SlotCache` instead
of `DynamicCache`'s concatenation, keeps logits for the last row only, and drops finished requests from the batch.
On CPU its decode steps (up to 8 requests) run the multi-row linears of pasta/decoding/linears.py, a single row
included: the same numbers as generate's up to float rounding, about 1.5x faster here.
"""

from __future__ import annotations

import time

import torch

from pasta.decoding.cache import SlotCache
from pasta.decoding.config import DecodeConfig
from pasta.decoding.linears import multirow_linears
from pasta.decoding.result import DecodeResult, DecodeStats
from pasta.decoding.sampling import choose_tokens, request_generators
from pasta.decoding.text import (
    TextCallback,
    TextStream,
    eos_token_ids,
    find_stop,
    pad_token_id,
    settled,
    text_decoder,
)
from pasta.errors import PastaError


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
    num_requests = len(prompt_ids_batch)
    if not num_requests or any(not ids for ids in prompt_ids_batch):
        raise PastaError("every prompt needs at least one token")
    if forced_ids is not None and (len(forced_ids) != num_requests or any(not ids for ids in forced_ids)):
        raise PastaError("forced_ids needs one non-empty response per prompt")
    started = time.perf_counter()
    device = model.device
    eos_ids = eos_token_ids(model, tokenizer)
    decode = text_decoder(tokenizer)
    limits = [len(ids) for ids in forced_ids] if forced_ids else [config.max_new_tokens] * num_requests
    max_stop_len = max((len(s) for s in config.stop_strings), default=0)
    generators = None if forced_ids else request_generators(config.sampling, num_requests, device, seeds)
    stream = TextStream(on_text, num_requests) if on_text else None

    prompt_len = max(len(ids) for ids in prompt_ids_batch)
    pad_id = pad_token_id(tokenizer)
    input_ids = torch.tensor([[pad_id] * (prompt_len - len(ids)) + ids for ids in prompt_ids_batch], device=device)
    padding_mask = torch.tensor(
        [[0] * (prompt_len - len(ids)) + [1] * len(ids) for ids in prompt_ids_batch], device=device
    )  # [B, S]
    position_ids = (padding_mask.cumsum(-1) - 1).masked_fill_(padding_mask == 0, 1)  # [B, S]
    cache = SlotCache.for_model(model, prompt_len + max(limits) + 1)
    cache.begin_step([0] * num_requests, prompt_len, device)
    logits = model(
        input_ids=input_ids,
        attention_mask=padding_mask if num_requests > 1 else None,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]  # [B, V]

    outputs: list[list[int]] = [[] for _ in range(num_requests)]
    stop_at: list[int | None] = [None] * num_requests
    checked_len = [0] * num_requests
    reasons = [""] * num_requests
    clocks = [[0.0, 0.0, 0.0] for _ in range(num_requests)]  # prefill_s, decode_s, bookkeeping_s
    active = list(range(num_requests))
    next_position = position_ids[:, -1]  # [B]
    step_start, first = started, True
    # Decode steps only: the prompt's prefill above ran on transformers' own linears, as generate's does.
    with multirow_linears(model, enabled=config.cpu_multirow_linears):
        while True:
            if forced_ids is not None:
                chosen = [forced_ids[r][len(outputs[r])] for r in active]
            elif generators is None:
                chosen = choose_tokens(logits, config.sampling, None).tolist()
            else:
                chosen = [int(choose_tokens(logits[b : b + 1], config.sampling, generators[r])[0])
                          for b, r in enumerate(active)]
            bookkeeping_start = time.perf_counter()
            keep = []
            for b, (r, token_id) in enumerate(zip(active, chosen, strict=True)):
                outputs[r].append(token_id)
                if forced_ids is None and token_id in eos_ids:
                    reasons[r] = "eos"
                elif config.stop_strings and token_id not in eos_ids:
                    text = decode(outputs[r])
                    stop_at[r] = find_stop(text, config.stop_strings, checked_len[r])
                    checked_len[r] = len(text)
                    reasons[r] = "stop_string" if stop_at[r] is not None else ""
                if not reasons[r] and len(outputs[r]) >= limits[r]:
                    reasons[r] = "max_new_tokens"
                if stream:
                    text = decode(outputs[r])
                    stream.update(r, text if reasons[r] else settled(text, max_stop_len))
                if not reasons[r]:
                    keep.append(b)
            now = time.perf_counter()
            for r in active:
                clocks[r][0 if first else 1] += now - step_start
                clocks[r][2] += now - bookkeeping_start
            first = False
            if not keep:
                break
            if len(keep) < len(active):
                active = [active[b] for b in keep]
                cache.keep(keep)
                index = torch.tensor(keep, device=device)
                padding_mask, next_position = padding_mask[index], next_position[index]
                chosen = [chosen[b] for b in keep]
            step_start = time.perf_counter()
            next_position = next_position + 1
            used = padding_mask.shape[1]
            padding_mask = torch.cat([padding_mask, padding_mask.new_ones(len(active), 1)], dim=1)  # [B, used + 1]
            cache.begin_step([used] * len(active), 1, device)
            logits = model(
                input_ids=torch.tensor(chosen, device=device)[:, None],  # [B, 1]
                attention_mask=padding_mask if num_requests > 1 else None,
                position_ids=next_position[:, None],  # [B, 1]
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]  # [B, V]

    results = []
    for r in range(num_requests):
        text = decode(outputs[r])
        if stop_at[r] is not None:
            text = text[: stop_at[r]]
        prefill_s, decode_s, bookkeeping_s = clocks[r]
        stats = DecodeStats(num_tokens=len(outputs[r]), num_steps=len(outputs[r]), prefill_s=prefill_s,
                            decode_s=decode_s, wall_s=prefill_s + decode_s, bookkeeping_s=bookkeeping_s,
                            finish_reason=reasons[r])
        results.append(DecodeResult(text=text, annotated=text, token_doc=None, token_ids=outputs[r], stats=stats))
    return results
