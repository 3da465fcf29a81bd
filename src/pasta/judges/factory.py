"""`build_judge(judge_cfg)`: the judge a `judge/` config group entry describes (conf/judge/*.yaml).

The config is checked against the judge's dataclass first (pasta.config.schema_from), so a misspelt key or a wrong type stops with one line
instead of being ignored. Each judge module is imported only when chosen: sentence-transformers and torch take
seconds to import.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.config import schema_from
from pasta.errors import PastaError
from pasta.judges.base import Judge

KINDS = ("embedding", "openai", "hf")


def judge_config(judge_cfg: DictConfig | dict[str, Any]) -> Any:
    """The typed config of the judge `judge_cfg.kind` names; a bad key or value is one PastaError."""
    cfg = judge_cfg if isinstance(judge_cfg, DictConfig) else OmegaConf.create(judge_cfg)
    kind = cfg.get("kind")
    if kind == "embedding":
        from pasta.judges.embedding import EmbeddingJudgeConfig

        return schema_from(cfg, EmbeddingJudgeConfig, "judge")
    if kind == "openai":
        from pasta.endpoints import check_endpoint_settings
        from pasta.judges.openai_judge import OpenAIJudgeConfig

        config = schema_from(cfg, OpenAIJudgeConfig, "judge")
        check_endpoint_settings("judge", config)
        return config
    if kind == "hf":
        from pasta.judges.hf_config import HFJudgeConfig

        return schema_from(cfg, HFJudgeConfig, "judge")
    raise PastaError(f"judge.kind: {kind!r} is not one of {', '.join(KINDS)} (judge=embedding|openai|hf)")


def build_judge(judge_cfg: DictConfig | dict[str, Any]) -> Judge:
    """Build the judge named by `judge_cfg.kind` (embedding | openai | hf) from its config."""
    cfg = judge_cfg if isinstance(judge_cfg, DictConfig) else OmegaConf.create(judge_cfg)
    config = judge_config(cfg)
    kind = cfg.get("kind")
    if kind == "embedding":
        from pasta.judges.embedding import EmbeddingJudge

        return EmbeddingJudge(config)
    if kind == "openai":
        from pasta.judges.openai_judge import OpenAIJudge

        return OpenAIJudge(config)
    from pasta.judges.hf_judge import HFJudge
    from pasta.models import load_model

    model_cfg = cfg.get("model")
    if model_cfg is None:
        raise PastaError("judge.model: judge=hf needs a model config (e.g. model@judge.model=smollm2-135m)")
    # The judge reads the model through its own forward, with transformers' own masks.
    model, tokenizer = load_model(model_cfg, device=config.device, check=False, path_key="judge.model.path")
    return HFJudge(config, model, tokenizer, model_name=str(model_cfg.get("name", "model")))
