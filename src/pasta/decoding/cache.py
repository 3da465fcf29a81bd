"""A preallocated KV cache written by slot index: one interleaved cache row per request, all requests in one batch.

Every thread of a request appends to its request's row. Before each forward the step names where its rows go
(`place(row_ids, slot_ids, kv_length)`: the key and value of packed row i land in cache row row_ids[0, i] at slot
slot_ids[0, i], written by index, no copy of the rest) and how many slots attention reads: the first `kv_length` of
every cache row, as a view (no copy). The rows are a packed step's (pasta/decoding/packing.py): every request's
rows one after another, [1, N].

Nothing in `update` depends on a Python value that changes from step to step except `kv_length` and the number of
cache rows, so a compiled step reuses its graph; the stores never move between steps (CUDA graphs replay on their
addresses). The one slot beyond the capacity (see `_static_store`) is never read: a compiled step's padding rows
write there.

Why not transformers' caches: `DynamicCache` concatenates (a copy of the whole cache per layer per step) and
`StaticCache` attends over its whole preallocated length; both advance every request by the same number of rows.
A request's row starts at `initial_capacity` slots and doubles when a step would overflow it. Requests join
(`add_rows`) and leave (`remove`) between steps, which is what continuous batching needs.

A compiled step's caches take their stores from the model's `StorePool` and give them back when dropped
(`release`), so the next decode call writes into the same tensors: CUDA graphs recorded on their addresses replay
instead of being recorded again for every cache.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

# Slots a request's cache row holds beyond its prompt and max_new_tokens: an asynchronous answer also feeds the
# openers the decoder supplies, and its chunk threads sample beside the main thread, so it may take more slots than
# it samples main-thread tokens. The row grows anyway when a step needs more; the margin spares that copy for most.
CAPACITY_MARGIN = 64


def initial_capacity(num_prompt_ids: int, max_new_tokens: int) -> int:
    """The slots a request's cache row and visibility table start with."""
    return num_prompt_ids + max_new_tokens + CAPACITY_MARGIN


def _static_store(store: torch.Tensor) -> torch.Tensor:
    """A key or value store [R, H, C + 1, D] as torch.compile should see it: its address stays put between steps
    (so CUDA graphs write into it in place, and a new store re-records rather than recompiles), and its head and
    head-size dims are the model's constants (only rows and capacity may change). The one slot beyond the capacity
    is never read: with it the attended view [:kv] is never the whole store, so the compiled step does not guard
    on whether it is (a contiguity check) and recompile once the capacity outgrows the slot bucket."""
    torch._dynamo.mark_static_address(store, guard=False)
    torch._dynamo.mark_static(store, 1)
    torch._dynamo.mark_static(store, 3)
    return store


class StorePool:
    """Key and value stores kept between the caches of one model: a cache asking for a store of a layer, kind and
    shape that an earlier cache released gets that tensor back (zeroed), at its address.

    Why: a CUDA-graph step replays on the stores' addresses (`_static_store`). A store at a new address makes
    torch.compile's CUDA-graph trees record the step again for every shape it meets, and keep the old recordings
    beside the new: a decode call that started a fresh cache paid one recording per step shape, and a process
    gathered recordings without bound. Capacities are rounded up to `capacity_multiple` slots so that caches for
    prompts of different lengths share shapes. What it costs: the stores of the largest cache stay allocated
    between calls."""

    def __init__(self, capacity_multiple: int = 1):
        self.capacity_multiple = capacity_multiple
        self._free: defaultdict[tuple, list[torch.Tensor]] = defaultdict(list)

    def capacity(self, num_slots: int) -> int:
        """The capacity a cache of at least `num_slots` slots gets."""
        return -(-num_slots // self.capacity_multiple) * self.capacity_multiple

    def take(self, name: tuple, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A zeroed store of `shape` with `like`'s dtype and device: the last one given back under `name` and
        shape, else a new one."""
        free = self._free[(name, shape, like.dtype, like.device)]
        return free.pop().zero_() if free else like.new_zeros(shape)

    def give_back(self, name: tuple, store: torch.Tensor) -> None:
        self._free[(name, tuple(store.shape), store.dtype, store.device)].append(store)

    def num_bytes(self) -> int:
        """Memory of the stores waiting to be taken."""
        return sum(t.numel() * t.element_size() for stores in self._free.values() for t in stores)


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values [B, H_kv, capacity, D], written at the owner's current slots."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: SlotCache, index: int):
        super().__init__()
        self.owner = owner
        self.index = index  # the layer's number: its stores' name in the owner's pool

    def _new_store(self, kind: str, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A zeroed store: from the owner's pool, if it has one."""
        pool = self.owner.pool
        return pool.take((self.index, kind), like, shape) if pool is not None else like.new_zeros(shape)

    def _give_back(self, *stores_by_kind: tuple[str, torch.Tensor]) -> None:
        if self.owner.pool is not None:
            for kind, store in stores_by_kind:
                self.owner.pool.give_back((self.index, kind), store)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        num_heads = key_states.shape[1]
        self.dtype, self.device = key_states.dtype, key_states.device
        num_rows, num_slots = self.owner.num_rows, self.owner.capacity + 1  # see _static_store
        # keys / values are views of the first B rows of these stores, so rows can leave and join without
        # reallocating the whole cache (continuous batching); a static batch uses every row.
        key_shape = (num_rows, num_heads, num_slots, key_states.shape[-1])  # [R, H, C+1, D]
        value_shape = (num_rows, num_heads, num_slots, value_states.shape[-1])
        self._set_stores(self._new_store("key", key_states, key_shape),
                         self._new_store("value", value_states, value_shape), num_rows)
        self.is_initialized = True

    def _set_stores(self, key_store: torch.Tensor, value_store: torch.Tensor, num_rows: int) -> None:
        self._key_store, self._value_store = _static_store(key_store), _static_store(value_store)
        self._use_rows(num_rows)

    def _use_rows(self, num_rows: int) -> None:
        self.keys = self._key_store[:num_rows]  # [B, H, C, D]
        self.values = self._value_store[:num_rows]  # [B, H, C, Dv]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write this step's rows [1, H, N, D] at the owner's (row, slot) ids [1, N]; every cache row's first
        kv_length slots [B, H, kv, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        owner = self.owner
        # The stores themselves are written (not the `keys` view): a compiled step then writes in place.
        self._key_store[owner.row_ids, :, owner.slot_ids] = key_states.transpose(1, 2)  # [1, N, H, D] at (row, :, slot)
        self._value_store[owner.row_ids, :, owner.slot_ids] = value_states.transpose(1, 2)
        num_rows, kv_length = owner.num_rows, owner.kv_length
        return self._key_store[:num_rows, :, :kv_length], self._value_store[:num_rows, :, :kv_length]

    def _reallocate(self, num_store_rows: int, capacity: int) -> None:
        """New stores of this size, holding the live rows."""
        num_rows = self.keys.shape[0]
        stores = []
        for kind, old in (("key", self._key_store), ("value", self._value_store)):
            shape = (num_store_rows, old.shape[1], capacity + 1, old.shape[-1])  # see _static_store
            new = self._new_store(kind, old, shape)
            new[:num_rows, :, : old.shape[2]] = old[:num_rows]
            stores.append(new)
        self._give_back(("key", self._key_store), ("value", self._value_store))
        self._set_stores(*stores, num_rows)

    def grow(self, capacity: int) -> None:
        if self.is_initialized:
            self._reallocate(self._key_store.shape[0], capacity)

    def add_rows(self, num_rows: int) -> None:
        """Append empty rows; the stores double when they run out of rows."""
        if not self.is_initialized:
            return
        old_rows = self.keys.shape[0]
        if old_rows + num_rows > self._key_store.shape[0]:
            self._reallocate(max(2 * self._key_store.shape[0], old_rows + num_rows), self.owner.capacity)
        self._key_store[old_rows : old_rows + num_rows].zero_()
        self._value_store[old_rows : old_rows + num_rows].zero_()
        self._use_rows(old_rows + num_rows)

    def move_row(self, source: int, target: int) -> None:
        if self.is_initialized:
            self._key_store[target] = self._key_store[source]
            self._value_store[target] = self._value_store[source]

    def truncate(self, num_rows: int) -> None:
        if self.is_initialized:
            self._use_rows(num_rows)

    def release(self) -> None:
        """The stores go back to the owner's pool; the layer holds none."""
        if self.is_initialized:
            self._give_back(("key", self._key_store), ("value", self._value_store))
            self._key_store = self._value_store = self.keys = self.values = None
            self.is_initialized = False

    def num_bytes(self) -> int:
        """Memory of the stores (live rows and the spare ones)."""
        if not self.is_initialized:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._key_store, self._value_store))

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.kv_length, 0

    def get_seq_length(self) -> int:
        return self.owner.seq_length

    def get_max_length(self) -> int:
        return self.owner.capacity


class SlotCache(Cache):
    """The batch's cache: `num_rows` cache rows of `capacity` slots. Call `place` before each forward. With a
    `pool`, its stores come from there (the capacity rounded up to the pool's multiple) and `release` returns them."""

    def __init__(self, num_layers: int, capacity: int, num_rows: int = 1, pool: StorePool | None = None):
        self.pool = pool
        self.capacity = self._rounded(capacity)
        self.num_rows = num_rows
        self.row_ids: torch.Tensor | None = None  # [1, N]: the cache row of each row of the next forward
        self.slot_ids: torch.Tensor | None = None  # [1, N]: its slot
        self.kv_length = 0  # slots the next forward attends over
        self.seq_length = 0  # the largest first slot of the next forward (transformers' `get_seq_length`)
        super().__init__(layers=[SlotLayer(self, index) for index in range(num_layers)])

    def _rounded(self, capacity: int) -> int:
        """The capacity the stores get: the pool's multiple, so caches of other lengths share shapes."""
        return self.pool.capacity(capacity) if self.pool is not None else capacity

    @classmethod
    def for_model(cls, model, capacity: int, num_rows: int = 1, pool: StorePool | None = None) -> SlotCache:
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return cls(config.num_hidden_layers, capacity, num_rows, pool)

    def place(self, row_ids: torch.Tensor, slot_ids: torch.Tensor, kv_length: int, seq_length: int) -> None:
        """The next forward writes its row i's key and value at (row_ids[0, i], slot_ids[0, i]), [1, N] each, and
        attends over the first `kv_length` slots; the caller has grown the capacity to hold both (`reserve`)."""
        self.row_ids, self.slot_ids = row_ids, slot_ids
        self.kv_length, self.seq_length = kv_length, seq_length

    def reserve(self, num_slots: int) -> None:
        """At least `num_slots` slots per row: the capacity doubles (or more) when it has fewer."""
        if num_slots > self.capacity:
            self.grow(max(2 * self.capacity, num_slots))

    def grow(self, capacity: int) -> None:
        """At least `capacity` slots per row, what was written kept."""
        if capacity > self.capacity:
            self.capacity = self._rounded(capacity)
            for layer in self.layers:
                layer.grow(self.capacity)

    def add_rows(self, num_rows: int) -> None:
        """Append empty cache rows for requests joining a running batch (their slots start at 0)."""
        self.num_rows += num_rows
        for layer in self.layers:
            layer.add_rows(num_rows)

    def remove(self, batch_indices: list[int]) -> list[int]:
        """Drop these rows, each hole filled by the current last row (one row copied per removal, nothing
        reallocated). Returns the new order: the old index of the row now at each position."""
        order = list(range(self.num_rows))
        for row in sorted(set(batch_indices), reverse=True):  # rows above `row` that go are already gone
            last = len(order) - 1
            if row != last:
                order[row] = order[last]
                for layer in self.layers:
                    layer.move_row(last, row)
            order.pop()
        self.num_rows = len(order)
        for layer in self.layers:
            layer.truncate(len(order))
        return order

    def release(self) -> None:
        """Done with: every layer's stores go back to the pool (without one, they are freed with the cache)."""
        for layer in self.layers:
            layer.release()

    def num_bytes(self) -> int:
        """Memory held by the keys and values of every layer."""
        return sum(layer.num_bytes() for layer in self.layers)
