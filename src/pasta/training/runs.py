"""Run folders of the training stages: where outputs go, resuming, and `train_info.json`.

A run folder holds `checkpoints/` (transformers checkpoints), `final/` (the model) and `train_info.json` (what was
trained on, the composed config, metrics). `train_info.json` is written when the run starts (status "running",
with the data hash) and rewritten when it ends (status "done", with metrics), so `resume=true` can refuse to
continue a run on different data or from a different model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.data import check_output_dir, write_json_atomic
from pasta.errors import PastaError

log = logging.getLogger(__name__)

TRAIN_INFO = "train_info.json"


def resolve_output_dir(cfg: DictConfig) -> Path:
    """`output_dir` from the config, else the Hydra run folder of this invocation; checked as a place to write
    (pasta.data.check_output_dir)."""
    if cfg.get("output_dir"):
        return check_output_dir(Path(cfg.output_dir).expanduser(), "output_dir")
    if cfg.get("resume"):
        raise PastaError("resume=true needs output_dir=<the folder of the run to continue>")
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    raise PastaError("set output_dir=/path/to/run/folder")


def checkpoint_damage(checkpoint: Path) -> str | None:
    """What makes a checkpoint folder unusable to resume from (a kill or a full disk while it was written), or
    None: its trainer state must read back, its safetensors be whole, and torch's files (optimizer, scheduler, RNG
    states: zip archives) end with their directory."""
    import json
    import zipfile

    from pasta.models import incomplete_weights

    state = checkpoint / "trainer_state.json"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # missing, unreadable, or not JSON
        return f"{state} does not read back ({exc})"
    problem = incomplete_weights(checkpoint)
    if problem is not None:
        return problem
    for path in sorted(checkpoint.glob("*.pt*")) + sorted(checkpoint.glob("*.bin")):
        if path.is_file() and not zipfile.is_zipfile(path):
            return f"{path} is incomplete"
    return None


def _checkpoints(checkpoint_dir: Path) -> dict[int, Path]:
    """transformers' checkpoint folders (checkpoint-<step>) by step."""
    if not checkpoint_dir.is_dir():
        return {}
    steps = {}
    for path in checkpoint_dir.iterdir():
        step = path.name.removeprefix("checkpoint-")
        if path.is_dir() and path.name.startswith("checkpoint-") and step.isdigit():
            steps[int(step)] = path
    return steps


def last_checkpoint(checkpoint_dir: Path) -> str | None:
    """The newest checkpoint that can be resumed from; a damaged newer one is passed over with a warning (the
    trainer keeps the one before it, `stage.save_total_limit`)."""
    checkpoints = _checkpoints(checkpoint_dir)
    for step in sorted(checkpoints, reverse=True):
        problem = checkpoint_damage(checkpoints[step])
        if problem is None:
            return str(checkpoints[step])
        log.warning("%s cannot be resumed from: %s; trying the one before", checkpoints[step], problem)
    return None


def checkpoint_to_resume(checkpoint_dir: Path, resume: bool) -> str | None:
    """The checkpoint to continue from; refuses to silently train over an earlier run's checkpoints."""
    if not resume:
        if _checkpoints(checkpoint_dir):
            raise PastaError(
                f"{checkpoint_dir} already holds checkpoints: pass resume=true to continue that run, or another "
                "output_dir"
            )
        return None
    found = last_checkpoint(checkpoint_dir)
    if not found:
        log.warning("resume=true but %s holds no checkpoint to resume from: starting from the beginning",
                    checkpoint_dir)
    return found


def read_train_info(output_dir: Path) -> dict[str, Any] | None:
    """What `write_train_info` last wrote, or None (also when it does not read back: a torn write, an edit)."""
    import json

    path = Path(output_dir) / TRAIN_INFO
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("%s does not read back (%s): the run's data is not compared with it", path, exc)
        return None
    return info if isinstance(info, dict) else None


def check_same_data(output_dir: Path, data_sha256: str) -> None:
    previous = read_train_info(output_dir)
    if previous is not None and previous.get("data_sha256") not in (None, data_sha256):
        raise PastaError(
            f"{output_dir} was trained on other data (sha256 {previous['data_sha256'][:12]}..., now "
            f"{data_sha256[:12]}...): resume it with the same data and model, or use another output_dir"
        )


def model_source(model: Any) -> str:
    """What a run's weights start from, as the config names it: `model.path`, else the hub id and revision, with
    the random initialisation's settings where the weights are drawn (model=tiny)."""
    if model.get("path"):
        return str(model["path"])
    source = str(model.get("hub_id")) + (f"@{model['revision']}" if model.get("revision") else "")
    init = model.get("random_init")
    if init:
        source += " random init " + " ".join(f"{key}={value}" for key, value in sorted(dict(init).items())
                                             if value is not None)
    return source


def same_source(saved: str, now: str) -> bool:
    if saved == now:
        return True
    try:  # one folder named relatively in one run and absolutely in the other
        return os.path.samefile(saved, now)
    except OSError:
        return False


def recorded_model_source(info: dict[str, Any] | None) -> str | None:
    """The `model_source` of the model a run's `train_info.json` (read back as `info`) records, or None."""
    saved_model = ((info or {}).get("config") or {}).get("model")
    return model_source(saved_model) if isinstance(saved_model, dict) else None


def check_same_model(output_dir: Path, model: DictConfig) -> None:
    """A resumed run continues from its own checkpoints and candidates: started from other weights, it would mix
    two models' work without a trace, so it is refused, the folder kept."""
    saved, now = recorded_model_source(read_train_info(output_dir)), model_source(model)
    if saved is not None and not same_source(saved, now):
        raise PastaError(
            f"{output_dir} was started from model {saved}, this run asks {now} (model.path / model.name): resume it "
            "with the same model, or use another output_dir"
        )


def write_train_info(output_dir: Path, cfg: DictConfig, **fields: Any) -> Path:
    """Write `<output_dir>/train_info.json`: the given fields plus the resolved config."""
    info = {**fields, "config": OmegaConf.to_container(cfg, resolve=True)}
    path = Path(output_dir) / TRAIN_INFO
    write_json_atomic(path, info)
    return path
