"""The PASTA-LANG reservation policy a checkpoint was trained with, kept beside its weights and checked on decoding.

Training and decoding must place a chunk's positions the same way (`lang.reservation`): a student trained with
counted promises and decoded under the uncounted default (or the reverse) would see every main-thread token after a
promise at positions it never saw in training, and nothing would say so. So the SFT and preference stages write the
policy into the checkpoint's folder (`pasta_lang.json`), and every stage that decodes a checkpoint takes its policy
through `decoding_policy`, which refuses a config that disagrees, in one line naming the setting to pass. A folder
without the file (a plain model, Baseline-SFT, a checkpoint trained before it was written) is decoded as configured.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pasta.errors import PastaError
from pasta.lang import ReservationPolicy

TRAINED_LANG = "pasta_lang.json"


def write_trained_policy(folder: Path, policy: ReservationPolicy) -> None:
    """Record in a trained checkpoint's folder the reservation policy it was trained with."""
    record = {"reservation": {k: str(v) if k == "policy" else v for k, v in dataclasses.asdict(policy).items()}}
    (Path(folder) / TRAINED_LANG).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def trained_policy(folder: Path) -> ReservationPolicy | None:
    """The policy recorded in `folder`, or None when it records none."""
    path = Path(folder) / TRAINED_LANG
    if not path.is_file():
        return None
    try:
        return ReservationPolicy(**json.loads(path.read_text(encoding="utf-8"))["reservation"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PastaError(f"{path}: not a PASTA-LANG record ({exc}); delete it to decode as configured") from None


# The setting each policy reads besides its name; the others do not move a position.
_PARAMETER = {"scale": "scale", "round_up": "multiple", "fixed": "fixed", "uncounted": "fixed"}


def _overrides(policy: ReservationPolicy) -> str:
    """The command-line settings that select `policy`."""
    parameter = _PARAMETER.get(str(policy.policy))
    return f"lang.reservation.policy={policy.policy}" + (
        f" lang.reservation.{parameter}={getattr(policy, parameter)}" if parameter else "")


def decoding_policy(reservation_cfg: Any, model_cfg: Any) -> ReservationPolicy:
    """`lang.reservation` as configured, checked against the policy the model at `model.path` was trained with."""
    policy = ReservationPolicy.from_config(reservation_cfg)
    folder = model_cfg.get("path")
    trained = trained_policy(Path(str(folder)).expanduser()) if folder else None  # as the loader reads it
    if trained is not None and _overrides(trained) != _overrides(policy):
        raise PastaError(
            f"model.path={folder} was trained with {_overrides(trained)}, not {_overrides(policy)}: decode it "
            "as it was trained, or chunk positions differ from training"
        )
    return policy
