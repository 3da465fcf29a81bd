"""The evaluated prompts: eval_data's records (a seeded eval.subset of them, then the first eval.limit), and where
each sits in AlpacaEval.

`eval.subset=N eval.subset_seed=S` picks the same N prompts for every model and decode mode (`select_subset`, which
also defines the held-out pool no training stage sees: pasta/data/heldout.py), so that every model of a study is
decoded on the same unseen prompts; `eval.limit` then keeps the first prompts of that subset (a quick
check on prompts of the study). run.json records the subset (`subset_meta`), and a run is neither resumed nor
scored with another one. Prompts of the full AlpacaEval set outside the held-out pool (any subset beyond its 300, or
another seed) may be training prompts (`data=alpaca_eval_gpt4` trains on every one): run.json counts them and the
run warns.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pasta.config import schema_from
from pasta.data import DataConfig, load_alpaca_eval
from pasta.data.heldout import HELDOUT_POOL_SIZE, is_heldout, select_subset
from pasta.errors import PastaError

ALPACA_EVAL_SIZE = 805


def subset_meta(subset: int | None, subset_seed: int) -> dict[str, int] | None:
    """What run.json records of the subset: {"size", "seed"}, or None for every prompt."""
    return None if subset is None else {"size": subset, "seed": subset_seed}


def eval_prompts(
    cfg: DictConfig, limit: int | None, subset: int | None = None, subset_seed: int = 0
) -> tuple[list[dict[str, Any]], list[str], dict[str, int] | None]:
    """(evaluated records, every instruction of the data set, AlpacaEval positions or None).

    The positions (index in the full 805-prompt set) are what alpaca_eval's LC GLM needs; None when eval_data is
    not the full AlpacaEval set.
    """
    data_cfg = schema_from(cfg.eval_data, DataConfig, "eval_data", only_known=True)
    full = load_alpaca_eval(dataclasses.replace(data_cfg, limit=None, offset=0, shuffle=False))
    records = load_alpaca_eval(data_cfg)
    if subset is not None:
        records = select_subset(records, subset, subset_seed)
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


def num_outside_heldout_pool(records: list[dict[str, Any]], instructions: list[str]) -> int | None:
    """How many evaluated prompts are outside the held-out pool, when the data set (`instructions`, all of its
    prompts) holds the whole pool, as AlpacaEval or a copy of it does; None for other data."""
    if sum(is_heldout(instruction) for instruction in instructions) < HELDOUT_POOL_SIZE:
        return None
    return sum(not is_heldout(record["instruction"]) for record in records)


def check_same_subset(meta: dict[str, Any], subset: int | None, subset_seed: int, run_dir: Path) -> None:
    """Raise PastaError if run.json (`meta`) records another subset than the one asked for."""
    recorded, asked = meta.get("subset"), subset_meta(subset, subset_seed)
    if recorded != asked:
        def describe(value: dict[str, int] | None) -> str:
            return "every prompt" if value is None else f"eval.subset={value['size']} eval.subset_seed={value['seed']}"

        raise PastaError(f"{run_dir} was decoded on {describe(recorded)}, not {describe(asked)}: give the same subset")
