"""A preallocated KV cache written by slot index: one interleaved cache per request, all requests in one batch.

Every thread of a request appends to the same cache: the runner hands each forward the first free slot of each
request (`begin_step`), the new key/value rows of request b land in slots [start_b, start_b + q), and attention
runs over the used prefix [0, max_b(start_b) + q) only, as a view (no copy). Rows of a request that are padding
in this step are written beyond that request's counter, where its next real rows will overwrite them; the mask
never lets a real row see them.

Why not transformers' caches: `DynamicCache` concatenates (a copy of the whole cache per layer per step) and
`StaticCache` attends over its whole preallocated length; both advance every request by the same q.
The capacity doubles when a step would overflow it (rare: it starts at prompt + max_new_tokens + a margin).
Requests leave (`keep`) and join (`add_rows`, or `merge` with a cache they prefilled on their own) between steps,
which is what continuous batching needs.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values [B, H_kv, capacity, D], written at the owner's current slots."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: SlotCache):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, num_heads = key_states.shape[:2]
        self.dtype, self.device = key_states.dtype, key_states.device
        capacity = self.owner.capacity
        # keys / values are views of the first B rows of these stores, so rows can leave and join without
        # reallocating the whole cache (continuous batching); a static batch uses every row.
        self._key_store = key_states.new_zeros(batch, num_heads, capacity, key_states.shape[-1])  # [R, H, C, D]
        self._value_store = value_states.new_zeros(batch, num_heads, capacity, value_states.shape[-1])
        self._use_rows(batch)
        self.is_initialized = True

    def _use_rows(self, num_rows: int) -> None:
        self.keys = self._key_store[:num_rows]  # [B, H, C, D]
        self.values = self._value_store[:num_rows]  # [B, H, C, Dv]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        owner = self.owner
        num_new = key_states.shape[-2]
        if owner.aligned_start is not None:  # every request starts at the same slot: one slice copy
            start = owner.aligned_start
            self.keys[:, :, start : start + num_new] = key_states
            self.values[:, :, start : start + num_new] = value_states
        else:
            index = owner.slot_index(key_states.shape[1], key_states.shape[-1])  # [B, H, q, D]
            self.keys.scatter_(2, index, key_states)
            self.values.scatter_(2, index, value_states)
        used = owner.used_length
        return self.keys[:, :, :used], self.values[:, :, :used]  # [B, H, used, D]

    def _reallocate(self, num_store_rows: int, capacity: int) -> None:
        """New stores of this size, holding the live rows."""
        num_rows = self.keys.shape[0]
        for name in ("_key_store", "_value_store"):
            old = getattr(self, name)
            new = old.new_zeros(num_store_rows, old.shape[1], capacity, old.shape[-1])
            new[:num_rows, :, : old.shape[2]] = old[:num_rows]
            setattr(self, name, new)
        self._use_rows(num_rows)

    def grow(self, capacity: int) -> None:
        if self.is_initialized:
            self._reallocate(self._key_store.shape[0], capacity)

    def add_rows(self, num_rows: int) -> None:
        """Append empty rows; the stores double when they run out of rows."""
        if not self.is_initialized:
            return
        old_rows = self.keys.shape[0]
        if old_rows + num_rows > self._key_store.shape[0]:
            self._reallocate(max(2 * self._key_store.shape[0], old_rows + num_rows), self._key_store.shape[2])
        self._key_store[old_rows : old_rows + num_rows].zero_()
        self._value_store[old_rows : old_rows + num_rows].zero_()
        self._use_rows(old_rows + num_rows)

    def append(self, other: SlotLayer) -> None:
        """Append `other`'s rows (same capacity, both initialized): only those rows are copied."""
        if not (self.is_initialized and other.is_initialized):
            raise ValueError("only caches that have run a forward can be merged")
        old_rows, num_rows = self.keys.shape[0], other.keys.shape[0]
        if old_rows + num_rows > self._key_store.shape[0]:
            self._reallocate(max(2 * self._key_store.shape[0], old_rows + num_rows), self._key_store.shape[2])
        self._key_store[old_rows : old_rows + num_rows] = other.keys
        self._value_store[old_rows : old_rows + num_rows] = other.values
        self._use_rows(old_rows + num_rows)

    def move_row(self, source: int, target: int) -> None:
        if self.is_initialized:
            self._key_store[target] = self._key_store[source]
            self._value_store[target] = self._value_store[source]

    def truncate(self, num_rows: int) -> None:
        if self.is_initialized:
            self._use_rows(num_rows)

    def keep(self, batch_indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._key_store = self.keys.index_select(0, batch_indices.to(self.device))
            self._value_store = self.values.index_select(0, batch_indices.to(self.device))
            self._use_rows(len(batch_indices))

    def num_bytes(self) -> int:
        """Memory of the stores (live rows and the spare ones)."""
        if not self.is_initialized:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._key_store, self._value_store))

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.seq_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.seq_length

    def get_max_length(self) -> int:
        return self.owner.capacity


class SlotCache(Cache):
    """The batch's cache. Call `begin_step(starts, q)` before each forward; `starts[b]` is request b's first slot."""

    def __init__(self, num_layers: int, capacity: int):
        self.capacity = capacity
        self.starts: list[int] = []
        self.num_new = 0
        self.aligned_start: int | None = None
        self.used_length = 0
        self.seq_length = 0  # slots before this step (aligned batches; transformers sizes 2-D masks with it)
        self._index: torch.Tensor | None = None
        self._index_key: tuple[int, int] | None = None
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    @classmethod
    def for_model(cls, model, capacity: int) -> SlotCache:
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return cls(config.num_hidden_layers, capacity)

    def begin_step(self, starts: list[int], num_new: int, device: torch.device | str = "cpu") -> None:
        """Place the next forward's `num_new` rows of request b at slots [starts[b], starts[b] + num_new)."""
        self.starts = list(starts)
        self.num_new = num_new
        self.used_length = max(starts) + num_new
        self.seq_length = max(starts)
        if self.used_length > self.capacity:
            self.capacity = max(2 * self.capacity, self.used_length)
            for layer in self.layers:
                layer.grow(self.capacity)
        self.aligned_start = starts[0] if all(s == starts[0] for s in starts) else None
        self._index = None
        self._device = device

    def slot_index(self, num_heads: int, head_dim: int) -> torch.Tensor:
        """The scatter index [B, H, q, D] of this step's rows, built once per step and shared by all layers."""
        if self._index is None or self._index_key != (num_heads, head_dim):
            starts = torch.tensor(self.starts, device=self._device)[:, None]  # [B, 1]
            slots = starts + torch.arange(self.num_new, device=self._device)  # [B, q]
            self._index = slots[:, None, :, None].expand(-1, num_heads, -1, head_dim)  # [B, H, q, D]
            self._index_key = (num_heads, head_dim)
        return self._index

    def add_rows(self, num_rows: int) -> None:
        """Append empty batch rows for requests joining a running batch (their slots start at 0)."""
        for layer in self.layers:
            layer.add_rows(num_rows)

    def merge(self, other: SlotCache) -> None:
        """Append `other`'s batch rows after this cache's (both have run a forward; capacities align upward)."""
        capacity = max(self.capacity, other.capacity)
        for cache in (self, other):
            if cache.capacity < capacity:
                cache.capacity = capacity
                for layer in cache.layers:
                    layer.grow(capacity)
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.append(theirs)

    def remove(self, batch_indices: list[int], num_rows: int) -> list[int]:
        """Drop these of the `num_rows` rows, each hole filled by the current last row (one row copied per
        removal, nothing reallocated). Returns the new order: the old index of the row now at each position."""
        order = list(range(num_rows))
        for row in sorted(set(batch_indices), reverse=True):  # rows above `row` that go are already gone
            last = len(order) - 1
            if row != last:
                order[row] = order[last]
                for layer in self.layers:
                    layer.move_row(last, row)
            order.pop()
        for layer in self.layers:
            layer.truncate(len(order))
        return order

    def num_bytes(self) -> int:
        """Memory held by the keys and values of every layer."""
        return sum(layer.num_bytes() for layer in self.layers)

    def keep(self, batch_indices: list[int]) -> None:
        """Drop finished requests: keep these batch rows, in this order."""
        index = torch.tensor(batch_indices, dtype=torch.long)
        for layer in self.layers:
            layer.keep(index)
