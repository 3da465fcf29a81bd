"""The annotation run's counts and its progress display: tqdm on a terminal, a log line every 30 s elsewhere."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

_LOG_EVERY_S = 30.0


@dataclass
class RunCounts:
    num_written: int = 0
    num_accepted: int = 0
    num_failed_requests: int = 0
    num_requests: int = 0
    last_error: str | None = None
    started: float = field(default_factory=time.monotonic)

    def as_dict(self, num_todo: int, num_already_done: int, num_duplicates: int) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {
            "num_todo": num_todo,
            "num_written": self.num_written,
            "num_accepted": self.num_accepted,
            "num_failed_requests": self.num_failed_requests,
            "num_already_done": num_already_done,
            "num_duplicates_in_input": num_duplicates,
            "elapsed_s": round(elapsed, 2),
            "records_per_s": round(self.num_written / elapsed, 2) if elapsed > 0 else None,
        }


class Progress:
    """tqdm on a terminal (records/s, ETA, acceptance so far); a log line every 30 s elsewhere."""

    def __init__(self, total: int, enabled: bool, counts: RunCounts):
        from tqdm.auto import tqdm

        self.counts = counts
        self.total = total
        interactive = enabled and sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="rec", desc="annotate", disable=not interactive, dynamic_ncols=True)
        self.log_lines = enabled and not interactive
        self.last_log = time.monotonic()

    def update(self) -> None:
        counts = self.counts
        acceptance = counts.num_accepted / counts.num_written if counts.num_written else 0.0
        self.bar.set_postfix(accepted=f"{100 * acceptance:.1f}%", refresh=False)
        self.bar.update(1)
        now = time.monotonic()
        if self.log_lines and now - self.last_log >= _LOG_EVERY_S:
            self.last_log = now
            rate = counts.num_written / max(now - counts.started, 1e-9)
            eta = (self.total - counts.num_written) / rate if rate > 0 else float("inf")
            log.info(
                "%d/%d records, %.1f%% accepted, %.1f records/s, ETA %.0f s",
                counts.num_written, self.total, 100 * acceptance, rate, eta,
            )  # fmt: skip

    def close(self) -> None:
        self.bar.close()
