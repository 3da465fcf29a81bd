"""One decoding step's forward, over shapes that move only between a few buckets, run as written or compiled.

A compiled step is worth its compilation only if its graph serves step after step, so a compiled decode step (every
step after a request's prefill) takes tensors of a few shapes only:

- rows: padded to `bucket_rows(q)`: q itself up to MAX_EXACT_ROWS, then the next multiple of it. The step runner
  (pasta/decoding/runner.py) pads its N packed rows and the width of its attention group (pasta/decoding/
  packing.py); the sequential decoder feeds one row per request.
- slots: attention reads the first `bucket_slots(used)` cache slots (multiples of SLOT_BUCKET), not just the used
  ones; the mask hides the rest.

The cache is preallocated and written by index (`SlotCache`), the masks and positions come in as tensors, and
nothing inside the step reads a value back to the host. The step runner's eager steps take every size exactly
(nothing is spent on padding rows in the linear layers, whose cost grows with them: beyond 8 rows the CPU linears
run on F.linear, bench_decode's c(q)); the sequential decoder keeps the slot buckets eagerly too (one row per
request: nothing to pad), so its eager and compiled steps are the same code. What the buckets cost: attention over
up to SLOT_BUCKET - 1 masked slots (on the embedded SmolLM2-135M about 12 MB of keys and values per request per
step beside 540 MB of weights), and up to 7 padding rows beyond 8.

`decode.compile`: `torch.compile(dynamic=True, fullgraph=True)` of `model_step`. The row and slot counts are
symbolic in its graph, so a new bucket compiles nothing; torch.compile specializes a size of 1, so one-row steps
(every sequential step) have a graph of their own, and more than 8 rows switch the CPU linears (a guard in
pasta/decoding/linears.py): up to three graphs per model, for one request (a batch of several specializes once
more). On CUDA, mode `reduce-overhead` replays a CUDA graph,
recorded once per bucket. A request's prefill (its prompt, a length of its own) always runs eagerly. A step that
cannot be compiled stops the decode with a PastaError saying so; it never falls back to eager in silence.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx.experimental._config

from pasta.decoding.attention import RaggedAttention
from pasta.errors import PastaError
from pasta.transformers_api import CACHE_ARGUMENT

MAX_EXACT_ROWS = 8
SLOT_BUCKET = 256
# Graphs per compiled function: a few per model (see above) for every model a process decodes with. Past the limit
# torch.compile would run the step eagerly without a word; with `fail_on_recompile_limit_hit` it raises instead.
# (Older torch releases name these settings differently: they keep their defaults there.)
_DYNAMO_LIMITS = {name: value for name, value in {"recompile_limit": 64, "fail_on_recompile_limit_hit": True}.items()
                  if hasattr(torch._dynamo.config, name)}


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def bucket_rows(num_rows: int) -> int:
    """The rows a decode step with `num_rows` rows per request feeds: the step's row bucket."""
    return num_rows if num_rows <= MAX_EXACT_ROWS else _round_up(num_rows, MAX_EXACT_ROWS)


def bucket_slots(num_slots: int) -> int:
    """The cache slots a decode step that uses `num_slots` of them attends over: the step's slot bucket."""
    return _round_up(num_slots, SLOT_BUCKET)


def model_step(model, cache, input_ids: torch.Tensor, position_ids: torch.Tensor,
               attention_mask: torch.Tensor | None, logits_to_keep: int | torch.Tensor = 0,
               ragged: RaggedAttention | None = None) -> torch.Tensor:
    """One forward: the rows input_ids / position_ids [b, q]; their keys and values go where `cache.place` put
    them. Batched rows [B, q] attend with the additive mask [B, 1, q, kv]; packed rows [1, N] (pasta/decoding/
    packing.py) with `ragged`, under the ragged attention (pasta/decoding/attention.py), and no mask. The logits
    [b, q, V] of every row (or those of `logits_to_keep`)."""
    extra = {} if ragged is None else {"ragged": ragged}
    return model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                 logits_to_keep=logits_to_keep, use_cache=True, **{CACHE_ARGUMENT: cache}, **extra).logits


_compiled_steps: dict[str, Callable] = {}


def _compiled_step(mode: str) -> Callable:
    """`model_step` compiled in `mode`, one per process and mode, so every decode call reuses its graphs."""
    if mode not in _compiled_steps:
        _compiled_steps[mode] = torch.compile(model_step, dynamic=True, fullgraph=True, mode=mode)
    return _compiled_steps[mode]


def compile_mode(mode: str | None, device: torch.device) -> str:
    """The torch.compile mode for `decode.compile_mode`: null gives CUDA graphs on CUDA and inductor's default
    elsewhere (CUDA graphs need CUDA)."""
    if mode is not None:
        return mode
    return "reduce-overhead" if device.type == "cuda" else "default"


class StepForward:
    """The decode steps' forward for one model: `model_step` eagerly, or compiled when `compile` is set."""

    def __init__(self, model, *, compile: bool = False, mode: str | None = None):
        self.model = model
        self.mode = compile_mode(mode, model.device) if compile else None
        self._compiled = _compiled_step(self.mode) if compile else None
        self._cuda_graphs = compile and model.device.type == "cuda" and self.mode in ("reduce-overhead", "max-autotune")

    @property
    def compiled(self) -> bool:
        """Decode steps run compiled (and take the buckets above)."""
        return self._compiled is not None

    def eager(self, cache, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
              logits_to_keep: int | torch.Tensor, ragged: RaggedAttention | None = None) -> torch.Tensor:
        """A step run as written: every step that feeds a prompt (a length of its own), and every step when not
        compiled."""
        return model_step(self.model, cache, input_ids, position_ids, attention_mask, logits_to_keep, ragged)

    def decode(self, cache, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               ragged: RaggedAttention | None = None) -> torch.Tensor:
        """A decode step, compiled when `compile` is set (its shapes then in the buckets above): the logits
        [b, q, V] of every row."""
        if self._compiled is None:
            return model_step(self.model, cache, input_ids, position_ids, attention_mask, ragged=ragged)
        if self._cuda_graphs:
            # The previous step's logits were read already: its CUDA-graph outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
        try:
            # Duck shaping would give two dims one symbol when their sizes happen to agree at the first trace (the
            # cache's capacity and the slot bucket, say) and recompile once they part.
            with torch._dynamo.config.patch(**_DYNAMO_LIMITS), torch.fx.experimental._config.patch(use_duck_shape=False):
                return self._compiled(self.model, cache, input_ids, position_ids, attention_mask, ragged=ragged)
        except torch._dynamo.exc.TorchDynamoException as exc:
            reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise PastaError(
                f"decode.compile=true: torch.compile could not compile the decode step ({reason}); "
                "decode.compile=false decodes without compiling"
            ) from None
