"""Decoding: the sequential baseline and the asynchronous PASTA-LANG decoder (one shared KV cache, one forward per
step for every thread of every request), with teacher forcing and streaming.

    from pasta.decoding import DecodeConfig, SamplingConfig, decode_async, decode_sequential
    config = DecodeConfig(max_new_tokens=256, sampling=SamplingConfig(temperature=0.0))
    baseline = decode_sequential(model, tokenizer, [prompt_ids], config)[0]
    pasta = decode_async(model, tokenizer, [prompt_ids], config, policy)[0]   # policy: pasta.lang.ReservationPolicy
    pasta.text, pasta.annotated, pasta.token_doc, pasta.stats.theoretical_speedup, pasta.stats.wall_s

Modules: config (DecodeConfig, SamplingConfig), interpreter (per-request thread state machines, no model), which
wires parser (the main thread's promise tags -> typed events), visibility (the per-request visibility table and
cache slots) and scheduler (the StepPlan: which tokens each thread feeds next), with threads (the chunk and
main-thread records and their states) and render (items -> text, document, TokenDoc),
cache (slot-indexed KV cache, a row per request), packing (one ragged step: every request's rows packed into one
[1, N] forward, and the attention groups that unpack them), step (a decode step's forward, eager or compiled over
bucketed shapes), runner (StepBatch, one step of a batch that requests join and leave, and the step loop), plain
(the sequential baseline as a step-planning request, for continuous batching), attention (the ragged attention of
packed steps; grouped-query SDPA on CPU), linears (linear layers of multi-row steps over every CPU thread), grammar (the tokens
that keep each thread's PASTA-LANG well-formed, for `decode.constrain`), sampling, text (detokenizing, stop strings,
streaming),
asynchronous and sequential (the entry points), result (DecodeResult, DecodeStats, TokenLogprobs).

`DecodeConfig(compile=True)` (`decode.compile=true`) compiles both decoders' decode steps with torch.compile; the
first decode pays the compilation, later ones reuse it (pasta/decoding/step.py).
"""

from pasta.decoding.asynchronous import decode_async, stream_async, teacher_forced_logprobs
from pasta.decoding.config import DecodeConfig, SamplingConfig
from pasta.decoding.result import DecodeResult, DecodeStats, TokenLogprobs
from pasta.decoding.sequential import decode_sequential

__all__ = [
    "DecodeConfig",
    "DecodeResult",
    "DecodeStats",
    "SamplingConfig",
    "TokenLogprobs",
    "decode_async",
    "decode_sequential",
    "stream_async",
    "teacher_forced_logprobs",
]
