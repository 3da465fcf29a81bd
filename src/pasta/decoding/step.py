"""A packed step's forward (pasta/decoding/packing.py), run as written or compiled: one entry, `StepForward`.

A compiled step is worth its compilation only if its graph serves step after step, so a compiled step (every step
that feeds no prompt) takes tensors of a few shapes only (packing.py's buckets):

- rows: the packed rows and the attention group's width, padded to `bucket_rows(q)`: q itself up to
  MAX_EXACT_ROWS, then the next multiple of it;
- slots: attention reads the first `bucket_slots(used)` cache slots (multiples of SLOT_BUCKET), not just the used
  ones; the mask hides the rest.

The cache is preallocated and written by index (`SlotCache`), the masks and positions come in as tensors, and
nothing inside the step reads a value back to the host. Eager steps take every size exactly: padding rows would
cost the linear layers, whose cost grows with the rows (docs/results/benchmarks.md has the curve), and padded slots
would cost attention. A step that feeds a prompt (a length of its own) always runs eagerly.

`decode.compile`: `torch.compile(dynamic=True, fullgraph=True)` of `model_step`. The row and slot counts are
symbolic in its graph, so a new bucket compiles nothing; torch.compile specializes a size of 1, so one-row steps
(the sequential baseline's, one request at a time) have a graph of their own, and more than 8 rows switch the CPU
linears (a guard in pasta/decoding/linears.py): a few graphs per model. On CUDA, mode `reduce-overhead` replays a
CUDA graph, recorded once per bucket and cache store: a compiled step's caches keep their stores in the model's
`StorePool` (pasta/decoding/cache.py) between calls, their capacity in multiples of SLOT_BUCKET. A step that
cannot be compiled stops the decode with a PastaError saying so; it never falls back to eager in silence.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.fx.experimental._config

from pasta.decoding.attention import RaggedAttention
from pasta.decoding.cache import SlotCache, StorePool
from pasta.decoding.packing import SLOT_BUCKET, PackedStep
from pasta.errors import PastaError
from pasta.transformers_api import CACHE_ARGUMENT

# Graphs per compiled function: a few per model (see above) for every model a process decodes with. Past the limit
# torch.compile would run the step eagerly without a word; with `fail_on_recompile_limit_hit` it raises instead.
# (Older torch releases name these settings differently: they keep their defaults there.)
_DYNAMO_LIMITS = {name: value for name, value in {"recompile_limit": 64, "fail_on_recompile_limit_hit": True}.items()
                  if hasattr(torch._dynamo.config, name)}


def model_step(model, cache, input_ids: torch.Tensor, position_ids: torch.Tensor, ragged: RaggedAttention,
               logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
    """One forward of the packed rows input_ids / position_ids [1, N]: their keys and values go where `cache.place`
    put them, and they attend with `ragged` under the ragged attention (pasta/decoding/attention.py). The logits
    [1, N, V] of every row, or those of `logits_to_keep`."""
    return model(input_ids=input_ids, position_ids=position_ids, attention_mask=None, logits_to_keep=logits_to_keep,
                 use_cache=True, ragged=ragged, **{CACHE_ARGUMENT: cache}).logits


_compiled_steps: dict[str, Callable] = {}


def _compiled_step(mode: str) -> Callable:
    """`model_step` compiled in `mode`, one per process and mode, so every decode call reuses its graphs."""
    if mode not in _compiled_steps:
        _compiled_steps[mode] = torch.compile(model_step, dynamic=True, fullgraph=True, mode=mode)
    return _compiled_steps[mode]


# One pool per model, for as long as the model lives: every compiled decode call of the process shares its stores.
_store_pools: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def store_pool(model) -> StorePool:
    """The model's cache store pool (the compiled steps' caches)."""
    if model not in _store_pools:
        _store_pools[model] = StorePool(capacity_multiple=SLOT_BUCKET)
    return _store_pools[model]


def compile_mode(mode: str | None, device: torch.device) -> str:
    """The torch.compile mode for `decode.compile_mode`: null gives CUDA graphs on CUDA and inductor's default
    elsewhere (CUDA graphs need CUDA)."""
    if mode is not None:
        return mode
    return "reduce-overhead" if device.type == "cuda" else "default"


class StepForward:
    """The forward of packed steps for one model: `model_step` eagerly, or compiled when `compile` is set (its
    caches then take their stores from `store_pool`)."""

    def __init__(self, model, *, compile: bool = False, mode: str | None = None):
        self.model = model
        self.mode = compile_mode(mode, model.device) if compile else None
        self._compiled = _compiled_step(self.mode) if compile else None
        self.store_pool = store_pool(model) if compile else None
        self._cuda_graphs = compile and model.device.type == "cuda" and self.mode in ("reduce-overhead", "max-autotune")

    @property
    def compiled(self) -> bool:
        """Steps without a prompt run compiled (and take packing.py's buckets)."""
        return self._compiled is not None

    def __call__(self, cache: SlotCache, packed: PackedStep) -> torch.Tensor:
        """The logits [n, V] of the step's choosing rows (`packed.sample_rows`, in order)."""
        if not packed.bucketed:
            logits = model_step(self.model, cache, packed.input_ids, packed.position_ids, packed.ragged,
                                packed.logits_to_keep)
            return logits.reshape(-1, logits.shape[-1])  # [n, V]
        # A compiled step computes every row's logits: its graph does not depend on which rows choose.
        sample_rows = torch.tensor(packed.sample_rows, device=packed.input_ids.device)  # [n]
        return self._compiled_forward(cache, packed)[0].index_select(0, sample_rows)  # [n, V]

    def _compiled_forward(self, cache: SlotCache, packed: PackedStep) -> torch.Tensor:
        if self._cuda_graphs:
            # The previous step's logits were read already: its CUDA-graph outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
        try:
            # Duck shaping would give two dims one symbol when their sizes happen to agree at the first trace (the
            # cache's capacity and the slot bucket, say) and recompile once they part.
            with torch._dynamo.config.patch(**_DYNAMO_LIMITS), torch.fx.experimental._config.patch(use_duck_shape=False):
                return self._compiled(self.model, cache, packed.input_ids, packed.position_ids, packed.ragged)
        except torch._dynamo.exc.TorchDynamoException as exc:
            reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise PastaError(
                f"decode.compile=true: torch.compile could not compile the decode step ({reason}); "
                "decode.compile=false decodes without compiling"
            ) from None
