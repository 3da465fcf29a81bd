"""Which attention features of a causal LM pasta trains and decodes correctly, and the one-line refusal of the rest.

pasta never runs a model's attention through transformers' own masks: the training layout (pasta.lang.layout) and
both decoders pass their own additive masks (or, in the step runner, their own attention function), so whatever
transformers would add to a causal mask is pasta's to honour. Read from the model's config alone, before any weight
loads (`check_architecture`, called by `load_model`):

- full causal attention on every layer (Llama, Qwen2.5, Qwen3, Gemma, Phi-3 without a window, OLMo 2): honoured;
- sliding-window attention on the model's own pattern of layers (Mistral 7B v0.1, Phi-3 mini 4k, Gemma 2, Gemma 3):
  honoured. pasta's one mask narrows to the window over positions on each layer that slides, in the training layout
  (pasta.decoding.layout_attention) and in both decoders (pasta.decoding.packing), as transformers' own mask does
  on a plain sequence (pasta/lang/mask.py);
- attention logit soft-capping (Gemma 2): honoured. Training runs the model's eager attention, or pasta's layout
  attention on a windowed model, and the decoders their ragged attention, all of which apply it;
- final-logit soft-capping (Gemma 2): honoured, the model's own forward applies it after the LM head;
- any other kind of layer in `config.layer_types` (chunked, linear or compressed attention...): refused, pasta's
  masks know full and sliding-window attention only.

A refusal is one PastaError naming the model, its model_type and every feature, before training or decoding starts.
(Attention sinks, which some sliding-window families add in their attention, are refused when pasta installs its
attention: pasta.decoding.attention.)

`attention_implementation` picks the attention a model loads with: the configured one (sdpa by default), or eager
for a model whose transformers class has no SDPA (Gemma 2: SDPA has no soft-capping).
"""

from __future__ import annotations

from dataclasses import dataclass

from pasta.errors import PastaError

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass(frozen=True)
class AttentionFeatures:
    """What a config says about its attention, as pasta needs to know it."""

    model_type: str
    layer_types: tuple[str, ...]  # per layer: FULL, SLIDING, or another kind
    sliding_window: int | None
    max_positions: int | None

    @classmethod
    def of(cls, config) -> AttentionFeatures:
        """The features of a transformers config (a multimodal one's text config)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        window = getattr(text, "sliding_window", None)
        layer_types = getattr(text, "layer_types", None)
        if layer_types is None:
            # Families without per-layer types (Mistral, Phi-3, Starcoder2) slide every layer when a window is set;
            # Qwen2's older configs say so with use_sliding_window.
            slides = window is not None and getattr(text, "use_sliding_window", True)
            layer_types = [SLIDING if slides else FULL] * int(text.num_hidden_layers)
        return cls(
            model_type=str(getattr(config, "model_type", "") or getattr(text, "model_type", "")),
            layer_types=tuple(str(kind) for kind in layer_types),
            sliding_window=window,
            max_positions=getattr(text, "max_position_embeddings", None),
        )

    @property
    def window_layers(self) -> list[int]:
        """The layers whose window can cut a sequence the model reads (shorter than its positions)."""
        if self.sliding_window is None:
            return []
        if self.max_positions is not None and self.sliding_window >= self.max_positions:
            return []
        return [i for i, kind in enumerate(self.layer_types) if kind == SLIDING]

    def unsupported(self) -> list[str]:
        """What pasta cannot honour, each said in a phrase; empty when it trains and decodes the model correctly."""
        others = sorted({kind for kind in self.layer_types if kind not in (FULL, SLIDING)})
        if others:
            return [f"{', '.join(others)} layers (pasta's masks know full and sliding-window attention only)"]
        return []


def check_architecture(config, name: str) -> None:
    """Refuse, in one line, a model whose attention pasta cannot train and decode correctly (the module docstring)."""
    features = AttentionFeatures.of(config)
    problems = features.unsupported()
    if problems:
        raise PastaError(
            f"model {name} (model_type {features.model_type}): pasta cannot train or decode its attention correctly "
            f"yet: {'; '.join(problems)}. Refused rather than run silently wrong"
        )


def attention_implementation(config, requested: str) -> str:
    """The attention implementation to load `config`'s model with: `requested`, or eager when it is sdpa and the
    model's transformers class has no SDPA (Gemma 2, whose soft-capping SDPA cannot apply: transformers refuses it)."""
    if requested != "sdpa":
        return requested
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    return "eager" if model_class is not None and not getattr(model_class, "_supports_sdpa", True) else requested
