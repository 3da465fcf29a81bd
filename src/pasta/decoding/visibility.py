"""One request's visibility table: which cache slots each of its threads sees, and the slots it has used.

A bool table, one row per thread over the request's cache slots, kept incrementally: a fed token takes the next
slot and sets it in its thread's row (`take_slot`); a fork copies the main row (promise_end included) into a free
row for the chunk (`fork`); a join ORs a chunk's row into the main row and frees it (`join`). Row 0 is for
padding: it sees slot 0 only (a query that sees nothing turns softmax into NaN). Row 1 is the main thread's.
The packed step cuts each fed token's row at its own slot, which gives the causal order among one step's tokens.
The table also counts, in Python, the slots the main row sees: while it sees every slot (nothing forked, or every
chunk joined) a main-thread row needs no mask at all (`main_sees_all`), which the sequential baseline's steps and
an answer that never forks always are.

It records each slot's position too (`slot_positions`), which a layer's sliding window reads (pasta/lang/mask.py:
the window is a rule over positions, and after a fork a slot's position is not its index). Kept as a Python list
and copied to a tensor only when a windowed model's step asks, so a model without a window pays one append per
fed token.
"""

from __future__ import annotations

import torch

PAD_ROW = 0
MAIN_ROW = 1


class VisibilityTable:
    """The rows [R, C] of one request, and its slot counter; rows and slots grow on demand."""

    def __init__(self, num_chunk_rows: int, capacity: int, device: torch.device | str = "cpu"):
        self.rows = torch.zeros(2 + num_chunk_rows, capacity, dtype=torch.bool, device=device)  # [R, C]
        self.rows[PAD_ROW, 0] = True
        self._free_rows = list(range(self.rows.shape[0] - 1, MAIN_ROW, -1))
        self.num_slots = 0  # cache slots used
        self._num_main_slots = 0  # of them, the slots the main row sees
        self._num_own_slots: dict[int, int] = {}  # a chunk row's slots since its fork (the main row sees none)
        self._positions: list[int] = []  # the position of each slot taken
        self._position_store: torch.Tensor | None = None  # [C'] the same, as a tensor, up to `_num_stored`
        self._num_stored = 0

    @property
    def main_sees_all(self) -> bool:
        """The main row sees every slot used so far."""
        return self._num_main_slots == self.num_slots

    def ensure_capacity(self, capacity: int) -> None:
        if capacity > self.rows.shape[1]:
            grown = self.rows.new_zeros(self.rows.shape[0], capacity)
            grown[:, : self.rows.shape[1]] = self.rows
            self.rows = grown

    def take_slot(self, row: int, position: int | None = None) -> int:
        """The next cache slot, now seen by `row`, for a token at `position` (None: the slot's index, as on a plain
        sequence)."""
        slot = self.num_slots
        self.num_slots += 1
        self._positions.append(slot if position is None else position)
        if slot >= self.rows.shape[1]:
            self.ensure_capacity(2 * self.rows.shape[1])
        self.rows[row, slot] = True
        if row == MAIN_ROW:
            self._num_main_slots += 1
        else:
            self._num_own_slots[row] = self._num_own_slots.get(row, 0) + 1
        return slot

    def slot_positions(self) -> torch.Tensor:
        """The position of every slot [C] (C at least the table's capacity): a taken slot's token's, and a slot not
        taken yet its index (what a request that writes its cache by hand, the cost model's probe, feeds there)."""
        store = self._position_store
        capacity = max(self.rows.shape[1], len(self._positions))
        if store is None or store.shape[0] < capacity:
            grown = torch.arange(capacity, device=self.rows.device)
            if store is not None:
                grown[: self._num_stored] = store[: self._num_stored]
            store = self._position_store = grown
        if self._num_stored < len(self._positions):
            store[self._num_stored : len(self._positions)] = torch.tensor(self._positions[self._num_stored :])
            self._num_stored = len(self._positions)
        return store

    def fork(self, through_slot: int | None = None) -> int:
        """A free row that sees what the main thread sees now, up to `through_slot` (None: every slot): a promise
        fed among drafted tokens forks once it is kept, and its chunk must not see the tokens drafted after it."""
        if not self._free_rows:
            old = self.rows.shape[0]
            self.rows = torch.cat([self.rows, self.rows.new_zeros(old, self.rows.shape[1])])
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        row = self._free_rows.pop()
        self.rows[row] = self.rows[MAIN_ROW]
        if through_slot is not None:
            self.rows[row, through_slot + 1 :] = False
        self._num_own_slots[row] = 0
        return row

    def drop_main_slots(self, slots: list[int]) -> None:
        """The main thread no longer sees these slots of its own (drafted tokens the model did not choose): they stay
        used, and nothing sees them again."""
        self.rows[MAIN_ROW, slots] = False
        self._num_main_slots -= len(slots)

    def join(self, row: int) -> None:
        """The main thread sees everything `row` sees; the row is free again (kept as is for this step's mask,
        a later fork overwrites it)."""
        self.rows[MAIN_ROW] |= self.rows[row]
        self._num_main_slots += self._num_own_slots.pop(row, 0)
        self._free_rows.append(row)
