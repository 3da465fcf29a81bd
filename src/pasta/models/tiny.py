"""Small randomly initialised causal LMs built from a config: the tiny Llama that heavy tests and smoke runs use, and
tiny twins of the other families pasta runs on.

A twin is the family's real transformers config class with a few layers and small dims, and the family's own
features kept (`FAMILIES`): grouped or full key/value heads, a head size other than hidden / heads, sliding windows
shorter than a test prompt on the family's own pattern of layers, attention and final-logit soft-capping, Gemma's
embedding scaling, QK norms, fused projections, tied or untied embeddings. Every model shares the real tokenizer
(and so the vocabulary, special tokens and chat template) of the embedded model, so every code path that tokenises
runs as it would for a real model; only the weights are random.

    model = build_tiny_model(tokenizer)                                # the tiny Llama (conf/model/tiny.yaml)
    model = build_tiny_model(tokenizer, family="gemma2", weight_std=0.3)  # a Gemma 2 twin whose greedy output varies
    model = build_tiny_model(tokenizer, family="qwen2", num_layers=24, hidden_size=896, num_heads=14,
                             num_kv_heads=2, intermediate_size=4864)   # Qwen2.5-0.5B's shape, random weights

`model=tiny model.architecture=<family>` builds the same twins in every stage (conf/model/tiny.yaml).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The twins' sliding window: shorter than any test prompt (a chat-template prompt is over 30 tokens), so a test
# decodes past it.
TWIN_WINDOW = 8


@dataclass(frozen=True)
class Sizes:
    """The sizes every family takes."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    head_dim: int | None  # None: the family's twin head size (Family.head_dim)
    sliding_window: int


@dataclass(frozen=True)
class Family:
    """How to build a twin of one transformers model_type."""

    config_class: str  # transformers' config class
    examples: str  # real models of the family, what its twin stands for
    features: Callable[[Sizes], dict[str, Any]] = field(default=lambda sizes: {})  # the family's own settings
    wide_heads: bool = False  # the real models' head size is not hidden / heads: the twin's is twice that
    tie_word_embeddings: bool = True
    attn_implementation: str | None = None  # an attention the family needs, whatever the config asks


def _every_other_layer_sliding(sizes: Sizes) -> list[str]:
    """Gemma 2's pattern: local (sliding) and global layers alternate, starting local."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(sizes.num_layers)]


def _five_local_one_global(sizes: Sizes) -> list[str]:
    """Gemma 3's pattern: every sixth layer global, the others local; a twin shorter than six layers keeps its last
    one global, so it has both kinds."""
    period = min(6, sizes.num_layers)
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(sizes.num_layers)]


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", "SmolLM2, Llama 3.x (the tiny model)"),
    "qwen2": Family(
        "Qwen2Config", "Qwen2.5 (qkv bias; a sliding_window in the config that no layer uses)",
        # Qwen2.5's configs carry a sliding_window with use_sliding_window=false (transformers 5.24 drops it then).
        features=lambda sizes: {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                                "use_sliding_window": False, "sliding_window": sizes.max_position_embeddings,
                                "max_window_layers": sizes.num_layers},
    ),
    "qwen3": Family(
        "Qwen3Config", "Qwen3 (per-head QK norm, head size 128 at any width)", wide_heads=True,
        features=lambda sizes: {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                                "use_sliding_window": False, "sliding_window": None},
    ),
    "gemma": Family("GemmaConfig", "Gemma 1 (gemma-7b: embeddings scaled by sqrt(hidden), GeLU, head size 256)",
                    wide_heads=True),
    "gemma2": Family(
        "Gemma2Config", "Gemma 2 (alternating local/global layers, attention and final-logit soft-capping)",
        wide_heads=True, attn_implementation="eager",  # transformers refuses SDPA for it: SDPA has no soft-capping
        features=lambda sizes: {"layer_types": _every_other_layer_sliding(sizes),
                                "sliding_window": sizes.sliding_window,
                                # Gemma 2 27B's query scale: 1 / sqrt(hidden / heads), not 1 / sqrt(head size)
                                "query_pre_attn_scalar": sizes.hidden_size // sizes.num_heads,
                                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    ),
    "gemma3_text": Family(
        "Gemma3TextConfig", "Gemma 3 text (5 local : 1 global layers, local and global RoPE bases, QK norm)",
        wide_heads=True,
        features=lambda sizes: {"layer_types": _five_local_one_global(sizes), "sliding_window": sizes.sliding_window,
                                "query_pre_attn_scalar": sizes.hidden_size // sizes.num_heads},
    ),
    "mistral": Family("MistralConfig", "Mistral 7B v0.1 (a sliding window on every layer)", tie_word_embeddings=False,
                      features=lambda sizes: {"sliding_window": sizes.sliding_window}),
    "phi3": Family(
        "Phi3Config", "Phi-3 mini 4k (fused qkv and gate/up projections, a 2047-token window on every layer)",
        tie_word_embeddings=False,
        features=lambda sizes: {"sliding_window": sizes.sliding_window,
                                "original_max_position_embeddings": sizes.max_position_embeddings},
    ),
    "olmo2": Family("Olmo2Config", "OLMo 2 (norms after attention and MLP, QK norm over all heads)",
                    tie_word_embeddings=False),
}


def twin_config(tokenizer: PreTrainedTokenizerBase, family: str, sizes: Sizes, attn_implementation: str = "sdpa"):
    """The config of `family`'s twin at `sizes`, with the tokenizer's vocabulary and special ids."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"no tiny twin of model type {family!r}; known: {', '.join(FAMILIES)}")
    spec = FAMILIES[family]
    head_dim = sizes.head_dim or (2 if spec.wide_heads else 1) * sizes.hidden_size // sizes.num_heads
    config_class = getattr(transformers, spec.config_class)
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=sizes.num_heads,
        num_key_value_heads=sizes.num_kv_heads,
        max_position_embeddings=sizes.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=spec.tie_word_embeddings,
        attn_implementation=spec.attn_implementation or attn_implementation,
        # The families whose real head size is not hidden / heads take it as a setting; Llama derives it.
        **({"head_dim": head_dim} if family != "llama" or sizes.head_dim else {}),
        **spec.features(sizes),
    )


def scale_weights(model: PreTrainedModel, std: float, seed: int, *, gains: bool = True) -> None:
    """Redraw every weight matrix but the embeddings from N(0, std^2), and (`gains`) add N(0, std^2) noise to every
    norm's gain, from `seed`. A config's own initialisation (std 0.02, unit gains) makes a tiny model repeat one
    token; so do Gemma 3's post-norms at unit gain (a greedy cycle of 2-3 tokens). At 0.3 with noisy gains greedy
    output varies, so parity checks mean something."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() >= 2 and "embed" not in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * std)
            elif gains and weight.dim() == 1 and "norm" in name:
                weight.add_(torch.randn(weight.shape, generator=generator) * std)


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    family: str = "llama",
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    head_dim: int | None = None,
    sliding_window: int = TWIN_WINDOW,
    seed: int = 0,
    weight_std: float | None = None,
    attn_implementation: str = "sdpa",
) -> PreTrainedModel:
    """A float32 causal LM of `family` (a transformers model_type of `FAMILIES`) with random weights drawn from
    `seed` (the global RNG is left untouched); `weight_std` redraws the weight matrices at that scale
    (`scale_weights`)."""
    import torch
    from transformers import AutoModelForCausalLM

    sizes = Sizes(num_layers, hidden_size, num_heads, num_kv_heads, intermediate_size, max_position_embeddings,
                  head_dim, sliding_window)
    config = twin_config(tokenizer, family, sizes, attn_implementation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    if weight_std is not None:
        scale_weights(model, weight_std, seed)
    return model.float()
