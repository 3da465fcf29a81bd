"""Answer one prompt with a model, the work behind `python -m pasta.generate`: check the request, load the model,
decode (async or sequential), print the answer as text (streamed) or JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from pasta.config import schema_from
from pasta.decoding import DECODE_MODES, DecodeConfig
from pasta.errors import PastaError

if TYPE_CHECKING:
    from pasta.decoding import DecodeResult

FORMATS = ("text", "json")


def decode_config(cfg: DictConfig) -> DecodeConfig:
    """`cfg.decode` with the top-level shortcuts applied; sampling seed defaults to the run's `seed`."""
    config = schema_from(cfg.decode, DecodeConfig, "decode")
    if cfg.get("max_new_tokens") is not None:
        config = dataclasses.replace(config, max_new_tokens=int(cfg.max_new_tokens))
    if config.sampling.seed is None and cfg.get("seed") is not None:
        config = dataclasses.replace(config, sampling=dataclasses.replace(config.sampling, seed=int(cfg.seed)))
    return config


def answer(cfg: DictConfig) -> DecodeResult:
    """Decode `cfg.prompt` with `cfg.model` in mode `cfg.decode.kind`; print it as `cfg.format` says."""
    from pasta.config import resolve_device
    from pasta.decoding import decode
    from pasta.lang import add_tag_tokens
    from pasta.models import encode_prompt, load_model
    from pasta.models.trained_lang import decoding_policy

    if OmegaConf.is_missing(cfg, "prompt") or not str(cfg.prompt).strip():
        raise PastaError('give the instruction to answer: prompt="..."')
    if cfg.decode.kind not in DECODE_MODES:
        raise PastaError(f"decode={cfg.decode.kind} is not one of {', '.join(DECODE_MODES)}")
    if cfg.format not in FORMATS:
        raise PastaError(f"format={cfg.format} is not one of {', '.join(FORMATS)}")
    config = decode_config(cfg)
    # Checked before the weights load: a checkpoint trained with another reservation policy is one line.
    policy = decoding_policy(cfg.lang.reservation, cfg.model) if cfg.decode.kind == "async" else None
    model, tokenizer = load_model(cfg.model, device=resolve_device(cfg.device))
    prompt_ids = encode_prompt(tokenizer, str(cfg.prompt), str(cfg.input or ""))

    def show(request: int, piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    on_text = show if cfg.format == "text" else None
    if policy is not None:
        add_tag_tokens(tokenizer, model)  # no-op for a PASTA checkpoint
    result = decode(model, tokenizer, [prompt_ids], config, mode=cfg.decode.kind, policy=policy, on_text=on_text)[0]

    if cfg.format == "json":
        print(json.dumps({"decode": cfg.decode.kind, **result.to_dict()}, ensure_ascii=False))
    else:
        stats = result.stats
        print(file=sys.stdout, flush=True)
        print(
            f"[{cfg.decode.kind}] {stats.num_tokens} tokens in {stats.num_steps} steps "
            f"(theoretical speedup {stats.theoretical_speedup:.2f}x), {stats.wall_s:.2f} s, "
            f"{stats.num_threads} chunk threads, finish: {stats.finish_reason}"
            + (f", malformed: {stats.malformed}" if stats.malformed else ""),
            file=sys.stderr,
        )
    return result
