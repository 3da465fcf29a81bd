"""The typed view of a `model:` config (conf/model/*.yaml): what to load and how.

`schema_from(cfg.model, ModelConfig, "model")` (pasta.config) accepts the composed `cfg.model` node, a plain dict or
a ModelConfig, resolves interpolations and rejects unknown keys with a PastaError, so a typo in a model file fails
loudly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pasta.config import user_cache_dir


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF file shipped inside a Python package, so that the model works with no hub access."""

    module: str = field(metadata={"help": "import name of the package; located without importing it"})
    file: str = field(metadata={"help": "GGUF file name inside the package folder"})
    package: str = field(metadata={"help": "pip requirement to install it with --no-deps, for error messages"})


@dataclass(frozen=True)
class RandomInit:
    """Sizes of a randomly initialised model built from a config (tests and smoke runs): a tiny twin of the family
    `model.architecture` names (pasta.models.tiny)."""

    num_layers: int = field(default=2, metadata={"help": "decoder layers"})
    hidden_size: int = field(default=64, metadata={"help": "model width"})
    num_heads: int = field(default=4, metadata={"help": "attention heads (hidden_size must divide by it)"})
    num_kv_heads: int = field(default=2, metadata={"help": "key/value heads (grouped-query attention)"})
    intermediate_size: int = field(default=128, metadata={"help": "MLP width"})
    max_position_embeddings: int = field(default=4096, metadata={"help": "longest position id"})
    head_dim: int | None = field(
        default=None,
        metadata={"help": "size of an attention head; null = hidden_size / num_heads, twice that for the families "
                          "whose real models use wider heads (qwen3, gemma*)"},
    )
    sliding_window: int = field(
        default=8,
        metadata={"help": "window of the layers the family slides (mistral, phi3, gemma2, gemma3_text): shorter than "
                          "a test prompt"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the weight initialisation"})
    weight_std: float | None = field(
        default=None,
        metadata={"help": "redraw the weight matrices at this std (and add it as noise to norm gains) so greedy "
                          "output varies (0.3); null = the config's own initialisation"},
    )


@dataclass(frozen=True)
class ModelConfig:
    """One model: where it comes from (path > embedded GGUF cache > hub id) and how to load it."""

    name: str = field(metadata={"help": "short name, used in run outputs"})
    hub_id: str | None = field(default=None, metadata={"help": "Hugging Face hub id; used when no local copy exists"})
    revision: str | None = field(default=None, metadata={"help": "hub branch, tag or commit; null = default"})
    path: str | None = field(default=None, metadata={"help": "local model folder (e.g. a checkpoint); wins over all"})
    embedded: EmbeddedModel | None = field(default=None, metadata={"help": "GGUF shipped in a Python package"})
    cache_dir: str = field(
        default_factory=lambda: str(Path(user_cache_dir()) / "models"),
        metadata={"help": "where embedded GGUF models are converted to safetensors, once"},
    )
    dtype: str = field(
        default="auto", metadata={"help": "auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 or float16"}
    )
    attn_implementation: str = field(
        default="sdpa", metadata={"help": "sdpa or eager take pasta's custom 4-D float attention masks"}
    )
    architecture: str | None = field(
        default=None,
        metadata={"help": "the transformers model_type (llama, qwen2, gemma, ...): the family a random_init model is "
                          "built as (null = llama), and the tiny twin whose tests cover a hub model"},
    )
    chat_template: str | None = field(
        default=None, metadata={"help": "Jinja chat template replacing the tokenizer's (base models); null = keep"}
    )
    random_init: RandomInit | None = field(
        default=None, metadata={"help": "sizes of a random model built from a config; null = pretrained weights"}
    )

    def validate(self, where: str) -> None:
        """A random model must be of a family pasta can build (pasta.models.tiny.FAMILIES)."""
        from pasta.errors import PastaError
        from pasta.models.tiny import FAMILIES

        if self.random_init is not None and self.architecture is not None and self.architecture not in FAMILIES:
            raise PastaError(f"{where}.architecture: no tiny twin of {self.architecture!r} for random_init; "
                             f"known: {', '.join(FAMILIES)}")
