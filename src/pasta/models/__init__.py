"""Models: configs (conf/model/*.yaml), loading (local folder > embedded GGUF cache > hub) with the refusal of an
attention pasta cannot honour (architecture.py), the tiny test model and the tiny twins of other families (tiny.py),
and the shared chat prompt format.

    from pasta.models import load_model, encode_prompt
    model, tokenizer = load_model(cfg.model, device="auto")
    prompt_ids = encode_prompt(tokenizer, "Give three tips for sleeping well.")
"""

from pasta.models.config import EmbeddedModel, ModelConfig, RandomInit
from pasta.models.loading import (
    incomplete_weights,
    load_model,
    load_tokenizer,
    max_positions,
    model_at,
    resolve_source,
)
from pasta.models.prompts import encode_chat, encode_prompt, encode_text_prompt, user_message
from pasta.models.tiny import build_tiny_model

__all__ = [
    "EmbeddedModel",
    "ModelConfig",
    "RandomInit",
    "build_tiny_model",
    "encode_chat",
    "encode_prompt",
    "encode_text_prompt",
    "incomplete_weights",
    "load_model",
    "load_tokenizer",
    "max_positions",
    "model_at",
    "resolve_source",
    "user_message",
]
