"""Decoding: the sequential baseline and the asynchronous PASTA-LANG decoder, both stepping through one step loop
(one packed forward per step for every thread of every request, one KV cache row per request), with teacher
forcing and streaming.

    from pasta.decoding import DecodeConfig, SamplingConfig, decode_async, decode_sequential
    config = DecodeConfig(max_new_tokens=256, sampling=SamplingConfig(temperature=0.0))
    baseline = decode_sequential(model, tokenizer, [prompt_ids], config)[0]
    pasta = decode_async(model, tokenizer, [prompt_ids], config, policy)[0]   # policy: pasta.lang.ReservationPolicy
    pasta.text, pasta.annotated, pasta.token_doc, pasta.stats.theoretical_speedup, pasta.stats.wall_s

Modules, one job each:
    config       DecodeConfig, SamplingConfig, DECODE_MODES
    interpreter  one asynchronous request's thread state machines (no model), wiring parser (the main thread's
                 promise tags -> typed events), visibility (which cache slots each thread sees) and scheduler (the
                 StepPlan: which tokens each thread feeds next), with threads (the thread records) and render
                 (items -> text, document, TokenDoc)
    plain        one request of the sequential baseline (the same interface)
    runner       THE step loop: StepBatch.step() plans, packs, runs the forward, chooses, commits; requests join
                 and leave between steps; engine_step, one turn of the engine loop offline and served decoding share
    timing       StepTiming (one record per step) and RequestClock (a request's sums of them)
    packing      one ragged step: every request's rows packed into one [1, N] forward, the attention groups that
                 unpack them, the compiled step's buckets
    attention    the attention functions pasta installs: the ragged attention of packed steps, and the training
                 layout's (`layout_attention`) for a model whose layers slide; both honour each layer's sliding
                 window and soft-capping
    step         a packed step's forward, eager or compiled (StepForward)
    cache        slot-indexed KV cache, a row per request
    linears      linear layers of multi-row CPU steps over every thread
    grammar      the tokens that keep each thread's PASTA-LANG well-formed (`decode.constrain`)
    sampling     choosing tokens from logits; text: detokenizing, stop strings, streaming
    requests     a request of either decoder, its chooser and its result
    api          the entry points: decode, decode_async, decode_sequential, stream_async, teacher_forced_logprobs
    cost_model   the cost model: a step's cost by rows, requests and cache length (StepCosts; no torch)
    step_costs   measuring it through the real step
    result       DecodeResult, DecodeStats, TokenLogprobs

`DecodeConfig(compile=True)` (`decode.compile=true`) compiles the steps that feed no prompt with torch.compile; the
first decode pays the compilation, later ones reuse it (pasta/decoding/step.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pasta.decoding.config import DECODE_MODES, DecodeConfig, SamplingConfig
from pasta.lazy import lazy_exports

# The rest is imported on first use: every command composes its config through DecodeConfig, and a bad command line
# is refused without importing torch or transformers, which only the decoders need.
__getattr__ = lazy_exports(__name__, {
    "pasta.decoding.api": ("decode", "decode_async", "decode_sequential", "stream_async", "teacher_forced_logprobs"),
    "pasta.decoding.attention": ("layout_attention",),
    "pasta.decoding.result": ("DecodeResult", "DecodeStats", "TokenLogprobs"),
    "pasta.decoding.runner": ("DecodeError",),
}, globals())

if TYPE_CHECKING:
    from pasta.decoding.api import (
        decode,
        decode_async,
        decode_sequential,
        stream_async,
        teacher_forced_logprobs,
    )
    from pasta.decoding.attention import layout_attention
    from pasta.decoding.result import DecodeResult, DecodeStats, TokenLogprobs
    from pasta.decoding.runner import DecodeError


__all__ = [
    "DECODE_MODES",
    "DecodeConfig",
    "DecodeError",
    "DecodeResult",
    "DecodeStats",
    "SamplingConfig",
    "TokenLogprobs",
    "decode",
    "decode_async",
    "decode_sequential",
    "layout_attention",
    "stream_async",
    "teacher_forced_logprobs",
]
