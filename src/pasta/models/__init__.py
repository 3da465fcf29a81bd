"""Models: configs (conf/model/*.yaml), loading (local folder > embedded GGUF cache > hub) with the refusal of an
attention pasta cannot honour (architecture.py), the tiny test model and the tiny twins of other families (tiny.py),
and the shared chat prompt format.

    from pasta.models import load_model, encode_prompt
    model, tokenizer = load_model(cfg.model, device="auto")
    prompt_ids = encode_prompt(tokenizer, "Give three tips for sleeping well.")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pasta.lazy import lazy_exports
from pasta.models.config import EmbeddedModel, ModelConfig, RandomInit
from pasta.models.loading import (
    incomplete_weights,
    load_model,
    load_tokenizer,
    max_positions,
    model_at,
    resolve_source,
)
from pasta.models.tiny import build_tiny_model

# The prompt format encodes through the language's tokens (torch): imported on first use (pasta.lazy), so that a
# command's config check, which reads ModelConfig, does not import torch.
__getattr__ = lazy_exports(__name__, {
    "pasta.models.prompts": ("encode_chat", "encode_prompt", "encode_text_prompt", "user_message"),
}, globals())

if TYPE_CHECKING:
    from pasta.models.prompts import encode_chat, encode_prompt, encode_text_prompt, user_message

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
