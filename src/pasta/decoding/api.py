"""The library's entry points: decode a batch (either decoder), stream one answer, replay a response.

    from pasta.decoding import DecodeConfig, decode_async, decode_sequential
    results = decode_async(model, tokenizer, [prompt_ids], DecodeConfig(max_new_tokens=256),
                           ReservationPolicy.from_config(cfg.lang.reservation))
    results[0].text, results[0].annotated, results[0].stats.theoretical_speedup
    baseline = decode_sequential(model, tokenizer, [prompt_ids], DecodeConfig(max_new_tokens=256))[0]

Each is a few lines over the one step loop (pasta/decoding/runner.py): build the requests and their choosers
(pasta/decoding/requests.py), step them to completion, and turn each into its DecodeResult. The asynchronous
decoder's tokenizer must carry the PASTA-LANG tag tokens and its model the matching embedding rows
(`pasta.lang.add_tag_tokens(tokenizer, model)`); training and decoding must use the same reservation policy.

A request whose own step fails ends alone; the call then raises its error once the others are done
(runner.run_to_completion: a DecodeError with the failure's reason, the body the server sends for it, or the
PastaError the request raised, as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from pasta.decoding.cache import initial_capacity
from pasta.decoding.config import DecodeConfig
from pasta.decoding.requests import (
    DecodeRequest,
    check_prompts,
    new_request,
    replay_chooser,
    request_limit,
    request_result,
    request_stats,
    sampling_chooser,
)
from pasta.decoding.result import DecodeResult, DecodeStats, TokenLogprobs
from pasta.decoding.runner import (
    Chooser,
    DecodeError,
    Member,
    StepBatch,
    StepOutcome,
    engine_step,
    run_to_completion,
)
from pasta.decoding.sampling import request_generators
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.step import StepForward
from pasta.decoding.text import TextCallback, TextStream, pad_token_id
from pasta.errors import PastaError
from pasta.lang import MAIN_THREAD, ReservationPolicy, TokenDoc


def _step_batch(model, tokenizer, config: DecodeConfig) -> StepBatch:
    forward = StepForward(model, compile=config.compile, mode=config.compile_mode)
    return StepBatch(model, pad_token_id(tokenizer), forward, multirow=config.cpu_multirow_linears)


def _run(model, tokenizer, requests: list[tuple[DecodeRequest, Chooser]], config: DecodeConfig,
         stream: TextStream | None = None, max_batch: int | None = None,
         on_finish: Callable[[int, Member], None] | None = None) -> list[Member]:
    """Step the requests to completion in one batch, at most `max_batch` at once; their members, in order."""
    index = {id(request): r for r, (request, _) in enumerate(requests)}

    def on_step(outcome: StepOutcome) -> None:
        for member in outcome.stepped:
            stream.update(index[id(member.request)], member.request.final_text())

    capacity = max(initial_capacity(len(request.prompt_ids), request_limit(config)) for request, _ in requests)
    with _step_batch(model, tokenizer, config) as batch:
        return run_to_completion(batch, requests, capacity, on_step if stream else None, max_members=max_batch,
                                 on_finish=on_finish)


def decode(
    model,
    tokenizer,
    prompt_ids_batch: list[list[int]],
    config: DecodeConfig,
    *,
    mode: str,
    policy: ReservationPolicy | None = None,
    on_text: TextCallback | None = None,
    seeds: list[int] | None = None,
    forced_ids: list[list[int]] | None = None,
    max_batch: int | None = None,
    on_result: Callable[[int, DecodeResult], None] | None = None,
) -> list[DecodeResult]:
    """Decode a batch of prompts with decode=`mode` (`DECODE_MODES`: async needs the reservation `policy`).

    `on_text(request, piece)` receives each request's plain text as it becomes final (an async chunk once it is
    spliced in order). `seeds[i]` seeds request i's sampling (default `config.sampling.seed + i`), so a request
    samples the same tokens alone or in any batch. `forced_ids[i]` (sequential only) replays that response for
    request i instead of sampling (teacher forcing: the benchmark's baseline decodes exactly the tokens of the
    asynchronous run it is compared with). `max_batch` caps the requests decoded at once (None: all of them): as
    one finishes the next prompt joins between steps, so a long list of prompts keeps the batch full instead of
    waiting for a static batch's longest answer. `on_result(i, result)` receives request i's result as soon as it
    finishes (a caller saves it there, and loses nothing to a later failure or kill).
    """
    check_prompts(prompt_ids_batch)
    if forced_ids is not None:
        if mode != "sequential":
            raise ValueError("forced_ids replays sequential responses; teacher_forced_logprobs replays async ones")
        if len(forced_ids) != len(prompt_ids_batch) or any(not ids for ids in forced_ids):
            raise PastaError("forced_ids needs one non-empty response per prompt")
    requests = [new_request(mode, model, tokenizer, ids, config, policy,
                            forced_ids=None if forced_ids is None else forced_ids[r])
                for r, ids in enumerate(prompt_ids_batch)]
    if forced_ids is not None:
        choosers = [replay_chooser(request, forced) for request, forced in zip(requests, forced_ids, strict=True)]
    else:
        generators = request_generators(config.sampling, len(requests), model.device, seeds)
        choosers = [sampling_chooser(request, tokenizer, config, generators[r] if generators else None)
                    for r, request in enumerate(requests)]
    stream = TextStream(on_text, len(requests)) if on_text else None
    results: dict[int, DecodeResult] = {}

    def finished(r: int, member: Member) -> None:
        results[r] = request_result(member.request, member.clock)
        if on_result is not None:
            on_result(r, results[r])

    try:
        _run(model, tokenizer, list(zip(requests, choosers, strict=True)), config, stream, max_batch, finished)
    except DecodeError as exc:  # the others' answers, for a caller that keeps them
        exc.results = [results.get(r) for r in range(len(requests))]
        raise
    return [results[r] for r in range(len(requests))]


def decode_async(model, tokenizer, prompt_ids_batch: list[list[int]], config: DecodeConfig,
                 policy: ReservationPolicy, on_text: TextCallback | None = None,
                 seeds: list[int] | None = None, max_batch: int | None = None,
                 on_result: Callable[[int, DecodeResult], None] | None = None) -> list[DecodeResult]:
    """Decode a batch of prompts, interpreting PASTA-LANG as the model writes it (`decode`, mode async)."""
    return decode(model, tokenizer, prompt_ids_batch, config, mode="async", policy=policy, on_text=on_text,
                  seeds=seeds, max_batch=max_batch, on_result=on_result)


def decode_sequential(model, tokenizer, prompt_ids_batch: list[list[int]], config: DecodeConfig, *,
                      on_text: TextCallback | None = None, seeds: list[int] | None = None,
                      forced_ids: list[list[int]] | None = None, max_batch: int | None = None,
                      on_result: Callable[[int, DecodeResult], None] | None = None) -> list[DecodeResult]:
    """Decode a batch of prompts one token per step, the baseline (`decode`, mode sequential). The answer's tags,
    if any, are plain tokens here."""
    return decode(model, tokenizer, prompt_ids_batch, config, mode="sequential", on_text=on_text, seeds=seeds,
                  forced_ids=forced_ids, max_batch=max_batch, on_result=on_result)


def stream_async(model, tokenizer, prompt_ids: list[int], config: DecodeConfig, policy: ReservationPolicy,
                 seed: int | None = None) -> Iterator[str]:
    """Decode one prompt, yielding plain-text pieces as they become final; their concatenation is the text."""
    pieces: list[str] = []
    request = new_request("async", model, tokenizer, prompt_ids, config, policy)
    generators = request_generators(config.sampling, 1, model.device, None if seed is None else [seed])
    choose = sampling_chooser(request, tokenizer, config, generators[0] if generators else None)
    stream = TextStream(lambda _, piece: pieces.append(piece), 1)
    capacity = initial_capacity(len(prompt_ids), config.max_new_tokens)
    joined: list[Member] = []

    def admit() -> None:  # the one request, on the first turn
        if not joined:
            joined.append(batch.join(request, choose, capacity))

    with _step_batch(model, tokenizer, config) as batch:
        while (outcome := engine_step(batch, admit)) is not None:
            if outcome.failed:
                failure = outcome.failed[0]
                raise failure.error if isinstance(failure.error, PastaError) else DecodeError([failure], joined)
            if joined[0] in outcome.stepped:
                stream.update(0, request.final_text())
            yield from pieces
            pieces.clear()


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
    config = DecodeConfig(max_new_tokens=max(1, len(token_doc.main_ids)), max_total_tokens=token_doc.num_tokens,
                          free_tag_tokens=0, max_threads=max(1, len(token_doc.chunks)), max_chunk_tokens=longest,
                          compile=compile, compile_mode=compile_mode)
    interpreter = new_request("async", model, tokenizer, prompt_ids, config, policy)
    streams = {MAIN_THREAD: list(token_doc.main_ids)}
    streams.update({k + 1: list(c.body_ids) for k, c in enumerate(token_doc.chunks)})
    logprobs: dict[int, list[torch.Tensor]] = {thread: [] for thread in streams}

    def force(logits: torch.Tensor, plan: StepPlan) -> list[int]:
        token_ids = []
        for row, thread in zip(logits, plan.sample_threads, strict=True):
            consumed = len(logprobs.get(thread, ()))
            if thread not in streams or consumed >= len(streams[thread]):
                raise PastaError("the token_doc does not replay as written: a thread ran past its tokens")
            token_id = streams[thread][consumed]
            logprobs[thread].append(torch.log_softmax(row.float(), dim=-1)[token_id])
            token_ids.append(token_id)
        return token_ids

    (member,) = _run(model, tokenizer, [(interpreter, force)], config)
    predicted = [c.num_predicted for c in interpreter.chunks]
    if (interpreter.malformed or any(len(logprobs[t]) != len(ids) for t, ids in streams.items())
            or predicted != [c.num_predicted for c in token_doc.chunks]):
        raise PastaError(
            f"the token_doc does not replay as written (malformed: {dict(interpreter.malformed)}; "
            "each promise's count digits must spell its chunk's num_predicted)"
        )
    stacked = {t: torch.stack(v) if v else torch.zeros(0) for t, v in logprobs.items()}
    result = TokenLogprobs(main=stacked[MAIN_THREAD], chunks=[stacked[k + 1] for k in range(len(token_doc.chunks))])
    return result, request_stats(interpreter, member.clock)
