"""Data-parallel decoding: the prompts of one job sharded over the processes of `accelerate launch`.

    accelerate launch --config_file conf/accelerate/ddp.yaml --num_processes 8 -m pasta.eval ...   # 8 GPUs
    accelerate launch --config_file conf/accelerate/cpu_ddp.yaml -m pasta.eval device=cpu ...        # 2 CPU processes

Each process decodes `Processes.shard(todo)` and appends its results, one fsynced line each, to its own part file
beside the job's JSONL file (`stats.part-1.jsonl` beside `stats.jsonl`). Then `ShardedJsonl.gather` has the main
process fold every part into the file, in the job's order, while the others wait; so the file ends as a one-process
run writes it. Parts are folded whatever process count wrote them, so a run killed with 2 processes resumes with 1
(or 4): `gather` also runs before work starts, and a rerun skips every record a part holds.

Files rather than `torch.distributed` collectives carry the records: what a process wrote survives its crash, and
`accelerate launch` (torchrun) stops the other processes when one fails, so a rerun continues from every line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pasta.data import JsonlAppender, iter_numbered_jsonl, write_jsonl_atomic

T = TypeVar("T")


@dataclass(frozen=True)
class Processes:
    """This process's place among the processes of a launch: index 0 of 1 when run without `accelerate launch`."""

    index: int = 0
    count: int = 1

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's share of `items`: every count-th from its index, so shares differ in size by at most 1."""
        return list(items[self.index :: self.count])

    def wait(self) -> None:
        """Block until every process gets here (nothing to wait for in one process)."""
        if self.count > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()


def current_processes() -> Processes:
    """The launch this process belongs to. Under `accelerate launch` (torchrun's WORLD_SIZE) this joins the process
    group: gloo on CPU, NCCL on GPUs, as accelerate chooses. Without it, no process group is created."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Processes()
    import torch
    from accelerate import PartialState

    # accelerate takes a launch without GPUs for a single process unless told it runs on CPUs (as transformers'
    # TrainingArguments tells it for `use_cpu`); the state is shared, so training under this launch sees the same.
    state = PartialState(cpu=not torch.cuda.is_available())
    return Processes(state.process_index, state.num_processes)


def part_path(path: Path, index: int) -> Path:
    """Process `index`'s part file beside `path`: stats.jsonl -> stats.part-<index>.jsonl."""
    return path.with_name(f"{path.name.removesuffix('.jsonl')}.part-{index}.jsonl")


def part_files(path: Path) -> list[Path]:
    """Every part file beside `path`, from this launch or an earlier one with any process count."""
    return sorted(path.parent.glob(f"{path.name.removesuffix('.jsonl')}.part-*.jsonl"))


class ShardedJsonl:
    """One job's JSONL file, written by every process of a launch through its own part file.

        store = ShardedJsonl(run_dir / "scores.jsonl", processes, key="id")
        store.gather()                        # fold a killed run's parts in, before reading what is done
        done = store.keys()
        with store.appender() as out: ...     # this process's records
        store.gather(order)                   # the main process folds every part in; the others wait

    Records are told apart by their `key` field: a later line with the same key replaces an earlier one.
    """

    def __init__(self, path: Path, processes: Processes, key: str):
        self.path = Path(path)
        self.processes = processes
        self.key = key

    def records(self) -> list[dict[str, Any]]:
        """The file's records (none before the first gather or append); read after `gather` to see every part."""
        return [record for _, record in iter_numbered_jsonl(self.path)] if self.path.is_file() else []

    def keys(self) -> set[Any]:
        """The keys of the file's records: what is done, once `gather` has folded the parts in."""
        return {record[self.key] for record in self.records()}

    def appender(self) -> JsonlAppender:
        """Where this process appends: the file itself in one process, its part file under a launch."""
        if self.processes.count == 1:
            return JsonlAppender(self.path)
        return JsonlAppender(part_path(self.path, self.processes.index))

    def gather(self, order: Sequence[Any] | None = None) -> None:
        """Fold the part files into the file (main process; the others wait for it).

        A record whose key is already in the file replaces it (the newer decode wins, as in a resumed file).
        With `order`, the file is rewritten with its records sorted by their key's place in `order` (keys not in
        it keep their place after those). The file is replaced atomically before the parts are deleted, so a kill
        in between leaves records twice, never lost; the next gather removes the repeat."""
        self.processes.wait()  # every process has closed its part
        if self.processes.is_main:
            self._fold(order)
        self.processes.wait()  # nobody reads the file before it is whole

    def _fold(self, order: Sequence[Any] | None) -> None:
        parts = part_files(self.path)
        # Opening an appender first cuts a line a killed process left half-written, as a rerun's appender would.
        for path in (self.path, *parts):
            if path.is_file():
                JsonlAppender(path).close()
        if not parts and order is None:
            return
        on_disk = self.records()
        by_key: dict[Any, dict[str, Any]] = {}
        for record in on_disk + [record for path in parts for _, record in iter_numbered_jsonl(path)]:
            by_key.pop(record[self.key], None)  # re-inserted last: the newer line wins its place too
            by_key[record[self.key]] = record
        records = list(by_key.values())
        if order is not None:
            place: dict[Any, int] = {}
            for i, k in enumerate(order):
                place.setdefault(k, i)  # a key listed twice (a duplicate input record) keeps its first place
            records.sort(key=lambda r: place.get(r[self.key], len(place)))
        if parts or records != on_disk:
            write_jsonl_atomic(self.path, records)
        for path in parts:
            path.unlink()
