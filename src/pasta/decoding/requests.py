"""One request of either decoder, as the step loop takes it: the request (its interpreter), the chooser of its
tokens, and its result. Written once for the library's entry points (pasta/decoding/api.py) and the server's
engine (pasta/serving/engine.py), so a request gets the same tokens, stats and errors from either.

- `new_request(mode, ...)`: an `Interpreter` (decode=async: PASTA-LANG interpreted as it is written) or a
  `PlainInterpreter` (decode=sequential: the baseline);
- `sampling_chooser`: the request's own sampling settings and generator, kept to well-formed PASTA-LANG when
  `decode.constrain` (pasta/decoding/grammar.py), and the drafted main-thread tokens it chooses kept
  (`decode.draft_skeleton`); the sequential baseline writes plain text, nothing to constrain;
- `request_result`: its DecodeResult, the stats from the request and its clock (pasta/decoding/timing.py).
"""

from __future__ import annotations

import torch

from pasta.decoding.cache import initial_capacity
from pasta.decoding.config import DECODE_MODES, DecodeConfig
from pasta.decoding.grammar import grammar_for
from pasta.decoding.interpreter import Interpreter
from pasta.decoding.plain import PlainInterpreter
from pasta.decoding.result import DecodeResult, DecodeStats
from pasta.decoding.runner import Chooser
from pasta.decoding.sampling import ban_repeated_ngrams, choose_legal_tokens, choose_tokens
from pasta.decoding.scheduler import StepPlan
from pasta.decoding.text import eos_token_ids, text_decoder
from pasta.decoding.timing import RequestClock
from pasta.errors import PastaError
from pasta.lang import MAIN_THREAD, ReservationPolicy, TagIds, encode_text

DecodeRequest = Interpreter | PlainInterpreter


def _tag_ids(model, tokenizer) -> TagIds:
    tag_ids = TagIds.from_tokenizer(tokenizer)
    num_rows = model.get_input_embeddings().weight.shape[0]
    if max(tag_ids.all) >= num_rows:
        raise PastaError(
            f"the model has {num_rows} embedding rows but the tag tokens go up to id {max(tag_ids.all)}: "
            "call pasta.lang.add_tag_tokens(tokenizer, model)"
        )
    return tag_ids


def check_prompts(prompt_ids_batch: list[list[int]]) -> None:
    if not prompt_ids_batch or any(not ids for ids in prompt_ids_batch):
        raise PastaError("every prompt needs at least one token")


def request_limit(config: DecodeConfig, forced_ids: list[int] | None = None) -> int:
    """The main-thread tokens a request may take: max_new_tokens, or a replayed response's length."""
    return config.max_new_tokens if forced_ids is None else len(forced_ids)


def new_request(mode: str, model, tokenizer, prompt_ids: list[int], config: DecodeConfig,
                policy: ReservationPolicy | None = None, *, forced_ids: list[int] | None = None) -> DecodeRequest:
    """One request of decode=`mode` (DECODE_MODES); async needs the reservation `policy`, and `forced_ids` replays
    a sequential response (teacher forcing)."""
    if mode not in DECODE_MODES:
        raise PastaError(f"decode={mode} is not one of {', '.join(DECODE_MODES)}")
    check_prompts([prompt_ids])
    capacity = initial_capacity(len(prompt_ids), request_limit(config, forced_ids))
    if mode == "sequential":
        return PlainInterpreter(prompt_ids, eos_ids=eos_token_ids(model, tokenizer), config=config,
                                decode=text_decoder(tokenizer), capacity=capacity, device=model.device,
                                forced_ids=forced_ids)
    if policy is None:
        raise ValueError("decode=async needs the reservation policy")
    return Interpreter(prompt_ids, tag_ids=_tag_ids(model, tokenizer), eos_ids=eos_token_ids(model, tokenizer),
                       policy=policy, config=config, decode=text_decoder(tokenizer), capacity=capacity,
                       device=model.device, encode=lambda text: encode_text(tokenizer, text))


def thread_history(interpreter: Interpreter, thread: int) -> list[int]:
    """The tokens `thread` has written: the main thread's (tags included), or a chunk's body."""
    return interpreter.main_ids if thread == MAIN_THREAD else interpreter.chunks[thread - 1].body_ids


def choose_request_tokens(interpreter: Interpreter, tokenizer, logits: torch.Tensor, threads: list[int],
                          config: DecodeConfig, generator: torch.Generator | None) -> list[int]:
    """One asynchronous request's tokens for one step, a row of `logits` [T, V] per thread of `threads`: the
    sampler's choice, without repeating a thread's own n-grams when `sampling.no_repeat_ngram_size`, kept to
    well-formed PASTA-LANG when `config.constrain` (the replaced choices counted in `interpreter.masked`)."""
    n = config.sampling.no_repeat_ngram_size
    unbanned = logits
    if n:
        exempt = interpreter.tag_ids.all | frozenset(interpreter.eos_ids)
        logits = ban_repeated_ngrams(logits, [thread_history(interpreter, t) for t in threads], n, exempt)
    if not config.constrain:
        return choose_tokens(logits, config.sampling, generator).tolist()
    grammar = grammar_for(tokenizer, interpreter.tag_ids, interpreter.eos_ids, logits.shape[-1], logits.device)
    constraints = [interpreter.constraint(thread, grammar) for thread in threads]
    if logits is not unbanned:  # a thread whose every legal token is banned chooses among them unbanned
        allowed = torch.stack([c.allowed for c in constraints])  # [T, V]
        stuck = ~(allowed & logits.isfinite()).any(dim=1)  # [T]
        logits[stuck] = unbanned[stuck]
    token_ids, masked_kinds = choose_legal_tokens(logits, config.sampling, generator, constraints)
    interpreter.masked.update(masked_kinds)
    interpreter.num_forced += sum(constraint.forced for constraint in constraints)
    return token_ids


def choose_with_draft(interpreter: Interpreter, tokenizer, logits: torch.Tensor, plan: StepPlan,
                      config: DecodeConfig, generator: torch.Generator | None) -> list[int | None]:
    """A step that fed drafted main-thread tokens (`plan.draft_ids`): the chunks' rows choose as always; the main
    thread's rows (its own token's, then each guess's) choose one at a time, each as it would at its own step, after
    the guesses kept before it. A guess the row before it chose is kept (`Interpreter.keep_drafted`: committed, fed
    already); the first choice that is not kept is the main thread's next token, and the rows after it choose
    nothing (None)."""
    threads = plan.sample_threads
    token_ids: list[int | None] = [None] * len(threads)
    chunk_rows = [i for i, thread in enumerate(threads) if thread != MAIN_THREAD]
    if chunk_rows:
        chosen = choose_request_tokens(interpreter, tokenizer, logits[chunk_rows], [threads[i] for i in chunk_rows],
                                       config, generator)
        for i, token_id in zip(chunk_rows, chosen, strict=True):
            token_ids[i] = token_id
    main_rows = [i for i, thread in enumerate(threads) if thread == MAIN_THREAD]
    for k, row in enumerate(main_rows):
        if not interpreter.main_samples:  # a kept guess ended the answer (its budget, a stop string)
            break
        (token_id,) = choose_request_tokens(interpreter, tokenizer, logits[row : row + 1], [MAIN_THREAD], config,
                                            generator)
        if k < len(plan.draft_ids) and token_id == plan.draft_ids[k] and interpreter.keep_drafted(token_id):
            continue
        token_ids[row] = token_id
        break
    return token_ids


def sampling_chooser(request: DecodeRequest, tokenizer, config: DecodeConfig,
                     generator: torch.Generator | None) -> Chooser:
    """The request's tokens drawn with its own settings and generator (rows in a fixed order: a request samples
    the same tokens alone or in any batch)."""
    if isinstance(request, Interpreter):
        def choose(logits: torch.Tensor, plan: StepPlan) -> list[int | None]:
            if plan.draft_ids:
                return choose_with_draft(request, tokenizer, logits, plan, config, generator)
            return choose_request_tokens(request, tokenizer, logits, plan.sample_threads, config, generator)
    else:  # the sequential baseline writes plain text: nothing to constrain
        n, exempt = config.sampling.no_repeat_ngram_size, frozenset(request.eos_ids)

        def choose(logits: torch.Tensor, plan: StepPlan) -> list[int]:
            if n:
                logits = ban_repeated_ngrams(logits, [request.main_ids], n, exempt)
            return choose_tokens(logits, config.sampling, generator).tolist()
    return choose


def replay_chooser(request: PlainInterpreter, forced_ids: list[int]) -> Chooser:
    """A sequential request's tokens replayed from `forced_ids`, one per step, whatever the logits say."""
    def choose(logits: torch.Tensor, plan: StepPlan) -> list[int]:
        return [forced_ids[len(request.main_ids)]]

    return choose


def request_stats(request: DecodeRequest, clock: RequestClock) -> DecodeStats:
    return DecodeStats(
        num_tokens=request.num_sampled,
        num_steps=request.num_steps,
        prefill_s=clock.prefill_s,
        decode_s=clock.decode_s,
        wall_s=clock.wall_s,
        bookkeeping_s=clock.host_s,
        forward_s=clock.forward_s,
        choose_s=clock.choose_s,
        num_threads=request.num_threads,
        num_overruns=request.num_overruns,
        malformed=dict(request.malformed),
        masked=dict(request.masked),
        finish_reason=request.finish_reason or "",
        step_rows=list(request.step_rows),
        num_forced=request.num_forced,
        num_drafted=request.num_drafted,
        num_draft_kept=request.num_draft_kept,
    )


def request_result(request: DecodeRequest, clock: RequestClock) -> DecodeResult:
    return DecodeResult(
        text=request.text(),
        annotated=request.annotated(),
        token_doc=request.token_doc(),
        token_ids=list(request.main_ids),
        stats=request_stats(request, clock),
    )
