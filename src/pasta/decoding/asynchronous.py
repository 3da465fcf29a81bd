"""The asynchronous decoder's entry points: decode a batch, stream one answer, replay a response (teacher forcing).

    from pasta.decoding import DecodeConfig, decode_async
    from pasta.lang import ReservationPolicy
    results = decode_async(model, tokenizer, [prompt_ids], DecodeConfig(max_new_tokens=256),
                           ReservationPolicy.from_config(cfg.lang.reservation))
    results[0].text, results[0].annotated, results[0].stats.theoretical_speedup

The tokenizer must carry the PASTA-LANG tag tokens and the model the matching embedding rows
(`pasta.lang.add_tag_tokens(tokenizer, model)`); training and decoding must use the same reservation policy.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from pasta.decoding.config import DecodeConfig
from pasta.decoding.grammar import grammar_for
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.result import DecodeResult, DecodeStats, TokenLogprobs
from pasta.decoding.runner import Chooser, RequestClock, run_steps
from pasta.decoding.sampling import choose_legal_tokens, choose_tokens, request_generators
from pasta.decoding.text import TextCallback, TextStream, eos_token_ids, pad_token_id, text_decoder
from pasta.errors import PastaError
from pasta.lang import MAIN_THREAD, ReservationPolicy, TagIds, TokenDoc


def _tag_ids(model, tokenizer) -> TagIds:
    tag_ids = TagIds.from_tokenizer(tokenizer)
    num_rows = model.get_input_embeddings().weight.shape[0]
    if max(tag_ids.all) >= num_rows:
        raise PastaError(
            f"the model has {num_rows} embedding rows but the tag tokens go up to id {max(tag_ids.all)}: "
            "call pasta.lang.add_tag_tokens(tokenizer, model)"
        )
    return tag_ids


def new_interpreter(model, tokenizer, prompt_ids: list[int], config: DecodeConfig, policy: ReservationPolicy,
                    capacity: int | None = None) -> Interpreter:
    """The interpreter of one request (a continuous batch creates one as each request arrives)."""
    if not prompt_ids:
        raise PastaError("every prompt needs at least one token")
    if capacity is None:
        capacity = len(prompt_ids) + config.max_new_tokens + 64
    return Interpreter(prompt_ids, tag_ids=_tag_ids(model, tokenizer), eos_ids=eos_token_ids(model, tokenizer),
                       policy=policy, config=config, decode=text_decoder(tokenizer), capacity=capacity,
                       device=model.device)


def _interpreters(model, tokenizer, prompt_ids_batch, config, policy) -> list[Interpreter]:
    if not prompt_ids_batch or any(not ids for ids in prompt_ids_batch):
        raise PastaError("every prompt needs at least one token")
    capacity = max(len(ids) for ids in prompt_ids_batch) + config.max_new_tokens + 64
    return [new_interpreter(model, tokenizer, ids, config, policy, capacity) for ids in prompt_ids_batch]


def choose_request_tokens(interpreter: Interpreter, tokenizer, logits: torch.Tensor, threads: list[int],
                          config: DecodeConfig, generator: torch.Generator | None) -> list[int]:
    """One request's tokens for one step, a row of `logits` [T, V] per thread of `threads`: the sampler's choice,
    kept to well-formed PASTA-LANG when `config.constrain` (the replaced choices counted in `interpreter.masked`).
    The batch decoder and the serving engine both choose here, so a request gets the same tokens from either."""
    if not config.constrain:
        return choose_tokens(logits, config.sampling, generator).tolist()
    grammar = grammar_for(tokenizer, interpreter.tag_ids, interpreter.eos_ids, logits.shape[-1], logits.device)
    constraints = [interpreter.constraint(thread, grammar) for thread in threads]
    token_ids, masked_kinds = choose_legal_tokens(logits, config.sampling, generator, constraints)
    interpreter.masked.update(masked_kinds)
    interpreter.num_forced += sum(constraint.forced for constraint in constraints)
    return token_ids


def _sampler(config: DecodeConfig, interpreters: list[Interpreter], tokenizer, device,
             seeds: list[int] | None) -> Chooser:
    generators = request_generators(config.sampling, len(interpreters), device, seeds)

    def choose(request: int, logits: torch.Tensor, threads: list[int]) -> list[int]:
        generator = generators[request] if generators else None
        return choose_request_tokens(interpreters[request], tokenizer, logits, threads, config, generator)

    return choose


def request_stats(interpreter: Interpreter, clock: RequestClock) -> DecodeStats:
    return DecodeStats(
        num_tokens=interpreter.num_sampled,
        num_steps=interpreter.num_steps,
        prefill_s=clock.prefill_s,
        decode_s=clock.decode_s,
        wall_s=clock.prefill_s + clock.decode_s,
        bookkeeping_s=clock.bookkeeping_s,
        num_threads=interpreter.num_threads,
        num_overruns=interpreter.num_overruns,
        malformed=dict(interpreter.malformed),
        masked=dict(interpreter.masked),
        finish_reason=interpreter.finish_reason or "",
        step_rows=list(interpreter.step_rows),
        num_forced=interpreter.num_forced,
    )


def request_result(interpreter: Interpreter, clock: RequestClock) -> DecodeResult:
    return DecodeResult(
        text=interpreter.text(),
        annotated=interpreter.annotated(),
        token_doc=interpreter.token_doc(),
        token_ids=list(interpreter.main_ids),
        stats=request_stats(interpreter, clock),
    )


def decode_async(
    model,
    tokenizer,
    prompt_ids_batch: list[list[int]],
    config: DecodeConfig,
    policy: ReservationPolicy,
    on_text: TextCallback | None = None,
    seeds: list[int] | None = None,
) -> list[DecodeResult]:
    """Decode a batch of prompts, interpreting PASTA-LANG as the model writes it.

    `on_text(request, piece)` receives each request's plain text as it becomes final (a chunk once it is spliced
    in order). `seeds[i]` seeds request i's sampling (default `config.sampling.seed + i`), so a request samples
    the same tokens alone or in any batch.
    """
    interpreters = _interpreters(model, tokenizer, prompt_ids_batch, config, policy)
    choose = _sampler(config, interpreters, tokenizer, model.device, seeds)
    clocks = [RequestClock() for _ in interpreters]
    stream = TextStream(on_text, len(interpreters)) if on_text else None
    for stepped in run_steps(model, interpreters, choose, pad_token_id(tokenizer), clocks):
        if stream:
            for r in stepped:
                stream.update(r, interpreters[r].final_text())
    return [request_result(i, c) for i, c in zip(interpreters, clocks, strict=True)]


def stream_async(
    model,
    tokenizer,
    prompt_ids: list[int],
    config: DecodeConfig,
    policy: ReservationPolicy,
    seed: int | None = None,
) -> Iterator[str]:
    """Decode one prompt, yielding plain-text pieces as they become final; their concatenation is the text."""
    interpreters = _interpreters(model, tokenizer, [prompt_ids], config, policy)
    choose = _sampler(config, interpreters, tokenizer, model.device, None if seed is None else [seed])
    emitted = ""
    for _ in run_steps(model, interpreters, choose, pad_token_id(tokenizer), [RequestClock()]):
        final = interpreters[0].final_text()
        if len(final) > len(emitted) and final.startswith(emitted):
            yield final[len(emitted) :]
            emitted = final


def teacher_forced_logprobs(
    model,
    tokenizer,
    prompt_ids: list[int],
    token_doc: TokenDoc,
    policy: ReservationPolicy,
    *,
    compile: bool = False,
    compile_mode: str | None = None,
) -> tuple[TokenLogprobs, DecodeStats]:
    """Replay `token_doc` through the decoder (every thread's tokens forced, nothing sampled).

    Returns the log-probability of each sampled token under the model, in the decoder's own steps (they equal
    one forward over `pasta.lang.build_layout` of the same structure), and the stats of the replay, whose
    num_steps / num_tokens are `pasta.lang.schedule(token_doc)`'s. `compile` / `compile_mode`: as
    `DecodeConfig.compile` / `compile_mode`.
    """
    tags = token_doc.tag_ids
    for k, chunk in enumerate(token_doc.chunks):
        if not chunk.body_ids or chunk.body_ids[-1] != tags.async_end or tags.async_end in chunk.body_ids[:-1]:
            raise PastaError(f"chunk {k} of the token_doc must end with <|async_end|>, and only there")
    longest = max([len(c.body_ids) for c in token_doc.chunks] + [1])
    config = DecodeConfig(max_new_tokens=max(1, len(token_doc.main_ids)),
                          max_threads=max(1, len(token_doc.chunks)), max_chunk_tokens=longest,
                          compile=compile, compile_mode=compile_mode)
    interpreters = _interpreters(model, tokenizer, [prompt_ids], config, policy)
    streams = {MAIN_THREAD: list(token_doc.main_ids)}
    streams.update({k + 1: list(c.body_ids) for k, c in enumerate(token_doc.chunks)})
    logprobs: dict[int, list[torch.Tensor]] = {thread: [] for thread in streams}

    def force(request: int, logits: torch.Tensor, threads: list[int]) -> list[int]:
        token_ids = []
        for row, thread in zip(logits, threads, strict=True):
            consumed = len(logprobs[thread])
            if consumed >= len(streams[thread]):
                raise PastaError("the token_doc does not replay as written: a thread ran past its tokens")
            token_id = streams[thread][consumed]
            logprobs[thread].append(torch.log_softmax(row.float(), dim=-1)[token_id])
            token_ids.append(token_id)
        return token_ids

    clock = RequestClock()
    for _ in run_steps(model, interpreters, force, pad_token_id(tokenizer), [clock]):
        pass
    interpreter = interpreters[0]
    predicted = [c.num_predicted for c in interpreter.chunks]
    if (interpreter.malformed or any(len(logprobs[t]) != len(ids) for t, ids in streams.items())
            or predicted != [c.num_predicted for c in token_doc.chunks]):
        raise PastaError(
            f"the token_doc does not replay as written (malformed: {dict(interpreter.malformed)}; "
            "each promise's count digits must spell its chunk's num_predicted)"
        )
    stacked = {t: torch.stack(v) if v else torch.zeros(0) for t, v in logprobs.items()}
    result = TokenLogprobs(main=stacked[MAIN_THREAD], chunks=[stacked[k + 1] for k in range(len(token_doc.chunks))])
    return result, request_stats(interpreter, clock)
