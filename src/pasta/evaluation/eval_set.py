"""The evaluated prompts: eval_data's records (first eval.limit of them), and where each sits in AlpacaEval."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig

from pasta.data import DataConfig, load_alpaca_eval
from pasta.errors import PastaError

ALPACA_EVAL_SIZE = 805


def eval_prompts(cfg: DictConfig, limit: int | None) -> tuple[list[dict[str, Any]], list[str], dict[str, int] | None]:
    """(evaluated records, every instruction of the data set, AlpacaEval positions or None).

    The positions (index in the full 805-prompt set) are what alpaca_eval's LC GLM needs; None when eval_data is
    not the full AlpacaEval set.
    """
    data_cfg = DataConfig.from_cfg(cfg.eval_data)
    full = load_alpaca_eval(dataclasses.replace(data_cfg, limit=None, offset=0, shuffle=False))
    records = load_alpaca_eval(data_cfg)
    if limit is not None:
        records = records[:limit]
    if not records:
        raise PastaError(f"eval_data {data_cfg.name} selects no prompts (check eval_data.limit/offset, eval.limit)")
    instructions = [record["instruction"] for record in full]
    positions = (
        {instruction: index for index, instruction in enumerate(instructions)}
        if len(full) == ALPACA_EVAL_SIZE else None
    )
    return records, instructions, positions
