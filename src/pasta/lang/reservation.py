"""How many positions the main thread skips for a chunk: the reservation policy (`lang.reservation`), which the
training layout (pasta.lang.layout) and the decoder apply alike. No torch: every command's config reads it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from pasta.choice import Choice
from pasta.errors import PastaError


class Reservation(Choice):
    """How a chunk's reserved positions follow from its predicted length N."""

    exact = "exact"  # N
    scale = "scale"  # ceil(scale * N)
    round_up = "round_up"  # N rounded up to a multiple of `multiple`
    fixed = "fixed"  # `fixed`, whatever N
    # No N at all: training data writes promises without tokens="N" (two tokens and the digits fewer on the main
    # thread's critical path, for a count the student did not learn to predict), and every chunk gets `fixed`.
    uncounted = "uncounted"


@dataclass(frozen=True)
class ReservationPolicy:
    """How many positions the main thread skips for a chunk whose promise predicted `tokens="N"`."""

    policy: Reservation = field(
        default=Reservation.uncounted,
        metadata={"help": "exact: N | scale: ceil(scale * N) | round_up: N up to a multiple of `multiple` | "
                          "fixed: `fixed` (N: the promise's tokens=\"N\") | uncounted: promises are trained "
                          "without tokens=\"N\", every chunk reserves `fixed`"},
    )
    scale: float = field(
        default=2.0, metadata={"help": "used by policy=scale (the paper's Pred-10X is scale=10)"}
    )
    multiple: int = field(default=16, metadata={"help": "used by policy=round_up"})
    fixed: int = field(
        default=64,
        metadata={"help": "used by policy=fixed and uncounted, and by any promise written without tokens=\"N\""},
    )

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        object.__setattr__(self, "policy", Reservation(self.policy))  # a config's string, as the member

    def problem(self) -> tuple[str, str] | None:
        """(field, why) of the first setting out of range, or None. A zero or negative reservation would place
        the main thread's later tokens on the chunk's positions."""
        if self.policy not in tuple(Reservation):
            return "policy", f"{str(self.policy)!r} is not one of {', '.join(Reservation)}"
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not self.scale > 0:
            return "scale", f"must be a number > 0, got {self.scale!r}"
        for name in ("multiple", "fixed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return name, f"must be an integer >= 1, got {value!r}"
        return None

    @property
    def counts(self) -> bool:
        """Whether promises carry tokens="N" in training data (the decoder reads either form)."""
        return self.policy != Reservation.uncounted

    def num_reserved(self, num_predicted: int | None) -> int:
        """Positions reserved for the chunk's content; `fixed` for a promise without a count."""
        if num_predicted is None:
            return self.fixed
        if self.policy == Reservation.exact:
            return num_predicted
        if self.policy == Reservation.scale:
            return math.ceil(self.scale * num_predicted)
        if self.policy == Reservation.round_up:
            return -(-num_predicted // self.multiple) * self.multiple
        return self.fixed

    def span(self, num_opener_ids: int, num_predicted: int | None) -> int:
        """Positions the main thread skips after `<|promise_end|>`: opener, reserved content, `<|async_end|>`."""
        return num_opener_ids + self.num_reserved(num_predicted) + 1

    @classmethod
    def from_config(cls, cfg, key: str = "lang.reservation") -> ReservationPolicy:
        """From a config node (`lang.reservation`); a bad value is a PastaError `<key>.<field>: <why>`."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(k for k in cfg if k not in known)
        if unknown:
            raise PastaError(f"{key}.{unknown[0]}: unknown setting (known: {', '.join(known)})")
        try:
            return cls(**{k: cfg[k] for k in known if k in cfg})
        except ValueError as exc:
            raise PastaError(f"{key}.{exc}") from None
