"""Check a composed config's settings before a stage starts: one `<key>: <why>` PastaError for the first bad one.

`pasta.cli.run_entry` calls `check_settings(cfg, config_name)` on the composed config before Hydra creates the run
directory, so a bad value stops the run before any file is written or any model is loaded. Each group is checked by
the typed view its stage reads it with (ReservationPolicy, DecodeConfig, DataConfig, ModelConfig, EvalConfig, the
judge's, teacher's and training stage's dataclasses), so the check and the use cannot disagree; the loose
top-level keys of the primary configs are checked here.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pasta.config import schema_from
from pasta.errors import PastaError

EVAL_ONLY_DECODE_MODES = ("sot",)  # Skeleton-of-Thought: prompting over the sequential decoder, pasta.eval's own
FORMATS = ("text", "json")


def _integer(cfg: DictConfig, key: str, low: int) -> None:
    """`key` is null or an integer >= `low`."""
    value = cfg.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PastaError(f"{key}: must be an integer >= {low} or null, got {value!r}")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise PastaError(f"{key}: {value!r} is not one of {', '.join(choices)}")


def _runtime(cfg: DictConfig) -> None:
    """The keys every primary config has (seed, num_threads, device, paths.output_root: Hydra makes its run folder
    there before the stage starts, so a file on the way would be a Hydra traceback)."""
    if "seed" in cfg:
        _integer(cfg, "seed", 0)
    if "num_threads" in cfg:
        _integer(cfg, "num_threads", 1)
    device = cfg.get("device")
    if device is not None and not (device in ("auto", "cpu", "mps") or str(device).startswith("cuda")):
        raise PastaError(f"device: {device!r} is not auto, cpu, mps, cuda or cuda:<index>")
    if "paths" in cfg:
        from pasta.data import check_output_dir

        check_output_dir(str(cfg.paths.output_root), "paths.output_root")


def _decode(cfg: DictConfig, config_name: str) -> None:
    from pasta.decoding import DECODE_MODES, DecodeConfig

    modes = (*DECODE_MODES, *EVAL_ONLY_DECODE_MODES) if config_name == "eval" else DECODE_MODES
    _choice("decode.kind", cfg.decode.get("kind"), modes)
    try:
        schema_from(cfg.decode, DecodeConfig, "decode")
    except PastaError as exc:
        message = str(exc)
        raise PastaError(message if message.startswith("decode") else f"decode.{message}") from None


def _groups(cfg: DictConfig, config_name: str) -> None:
    """The config groups a primary config may hold, each through its stage's own typed view."""
    if "lang" in cfg:
        from pasta.lang import ReservationPolicy

        ReservationPolicy.from_config(cfg.lang.reservation)
    if "model" in cfg:
        from pasta.models.config import ModelConfig

        schema_from(cfg.model, ModelConfig, "model")
    for group in ("data", "eval_data"):
        if group in cfg:
            from pasta.data import DataConfig

            schema_from(cfg[group], DataConfig, group, only_known=True)
    if "decode" in cfg:
        _decode(cfg, config_name)
    if "eval" in cfg:
        from pasta.evaluation.config import EvalConfig

        schema_from(cfg.eval, EvalConfig, "eval")
    if "judge" in cfg:
        from pasta.judges.factory import judge_config

        judge_config(cfg.judge)
    if "teacher" in cfg:
        from pasta.teachers import teacher_config

        teacher_config(cfg.teacher)
    if "stage" in cfg:
        from pasta.training.config import TrainingData, settings_from_cfg

        settings_from_cfg(cfg.stage)
        TrainingData.from_data_cfg(cfg.data)


def _generate(cfg: DictConfig) -> None:
    _choice("format", cfg.get("format"), FORMATS)
    _integer(cfg, "max_new_tokens", 1)


def _serve(cfg: DictConfig) -> None:
    """The server's address and uvicorn's log level: checked here, else a bind or uvicorn fails with a traceback
    once the model has loaded. Whether limits.context_length fits the model needs the model's config: build_app."""
    from uvicorn.config import LOG_LEVELS

    from pasta.serving.server import ServeLimits

    port = cfg.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise PastaError(f"port: must be an integer from 0 to 65535, got {port!r}")
    _choice("log_level", cfg.get("log_level"), tuple(LOG_LEVELS))
    schema_from(cfg.limits, ServeLimits, "limits")


def check_settings(cfg: DictConfig, config_name: str) -> None:
    """Raise one PastaError `<key>: <why>` for the first setting of `cfg` that its stage would reject."""
    try:
        _runtime(cfg)
        _groups(cfg, config_name)
        if config_name == "generate":
            _generate(cfg)
        if config_name == "serve":
            _serve(cfg)
        if config_name == "annotate":
            from pasta.annotation.config import AnnotateConfig

            schema_from(cfg, AnnotateConfig, "", only_known=True)
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve, a missing mandatory value
        key = getattr(exc, "full_key", None)
        raise PastaError(f"{key + ': ' if key else ''}{str(exc).splitlines()[0]}") from None
    if config_name == "generate" and not OmegaConf.is_missing(cfg, "prompt"):
        from pasta.data import check_text

        check_text(str(cfg.prompt), "prompt")
        check_text(str(cfg.get("input") or ""), "input")
