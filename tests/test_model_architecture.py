"""The families pasta runs (the tiny twins of pasta.models.tiny), the conf/model entries they cover, and the refusal of
an attention pasta cannot honour (pasta.models.architecture): one line naming the model type and the feature,
before any weight loads."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from pasta.config import compose, conf_dir
from pasta.decoding.attention import attention_window
from pasta.errors import PastaError
from pasta.models import load_model
from pasta.models.architecture import AttentionFeatures, attention_implementation, check_architecture
from pasta.models.loading import model_config
from pasta.models.tiny import FAMILIES, TWIN_WINDOW, Sizes, twin_config

WINDOWS = {  # family -> the twin's sliding layers (its window: TWIN_WINDOW), as its real models have them
    "gemma2": [0], "gemma3_text": [0], "mistral": [0, 1], "phi3": [0, 1],
}


def sizes(**changes) -> Sizes:
    return Sizes(**{"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128,
                    "max_position_embeddings": 4096, "head_dim": None, "sliding_window": TWIN_WINDOW, **changes})


@pytest.mark.parametrize("family", FAMILIES)
def test_every_twin_is_accepted_with_the_windows_pasta_applies(tiny_model_and_tokenizer, family):
    """Sliding windows and soft-capping are honoured (tests/test_architecture_matrix.py checks how); the layers the
    refusal check reads as sliding are the ones whose window the decoder and the training layout apply."""
    config = twin_config(tiny_model_and_tokenizer[1], family, sizes())
    features = AttentionFeatures.of(config)
    assert features.unsupported() == []
    check_architecture(config, "twin")
    assert features.window_layers == WINDOWS.get(family, [])
    assert attention_window(SimpleNamespace(config=config)) == (TWIN_WINDOW if family in WINDOWS else None)


def test_qwen2s_unused_window_and_a_window_as_long_as_the_positions_are_no_window(tiny_model_and_tokenizer):
    tokenizer = tiny_model_and_tokenizer[1]
    qwen2 = twin_config(tokenizer, "qwen2", sizes())
    qwen2.sliding_window = 32768  # Qwen2.5's configs carry one, with use_sliding_window=false: no layer slides
    assert not qwen2.use_sliding_window and set(qwen2.layer_types) == {"full_attention"}
    assert AttentionFeatures.of(qwen2).window_layers == []
    assert attention_window(SimpleNamespace(config=qwen2)) is None
    for family in ("mistral", "phi3", "gemma3_text"):
        assert AttentionFeatures.of(twin_config(tokenizer, family, sizes(sliding_window=4096))).window_layers == []


def test_gemma2_loads_with_eager_attention_since_it_has_no_sdpa(tiny_model_and_tokenizer):
    """transformers refuses SDPA for Gemma 2 (no soft-capping there): a hub Gemma 2 loads with eager attention
    whatever model.attn_implementation says, every other family with what it says."""
    tokenizer = tiny_model_and_tokenizer[1]
    assert attention_implementation(twin_config(tokenizer, "gemma2", sizes()), "sdpa") == "eager"
    for family in ("llama", "gemma3_text", "mistral"):
        config = twin_config(tokenizer, family, sizes())
        assert attention_implementation(config, "sdpa") == "sdpa"
        assert attention_implementation(config, "eager") == "eager"


def test_layer_kinds_other_than_full_and_sliding_are_refused(tiny_model_and_tokenizer):
    config = twin_config(tiny_model_and_tokenizer[1], "qwen3", sizes())
    config.layer_types = ["full_attention", "chunked_attention"]  # Llama 4's local layers, say
    with pytest.raises(PastaError, match=r"model_type qwen3\): .*chunked_attention layers \(pasta's masks know full"):
        check_architecture(config, "twin")


def chunked_config(tokenizer):
    """A Qwen3 twin's config whose second layer is of a kind pasta's masks do not know (Llama 4's chunked layers)."""
    config = twin_config(tokenizer, "qwen3", sizes())
    config.layer_types = ["full_attention", "chunked_attention"]
    return config


def test_a_refused_model_loads_no_weight(tiny_model_and_tokenizer, tmp_path, monkeypatch):
    """A trained checkpoint's folder (model.path) is read for its config alone: the refusal comes first."""
    tokenizer = tiny_model_and_tokenizer[1]
    chunked_config(tokenizer).save_pretrained(tmp_path)  # a config, no weights at all
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(PastaError, match=r"model ckpt \(model_type qwen3\): .*chunked_attention layers"):
        load_model({"name": "ckpt", "path": str(tmp_path)})
    import pasta.models.tiny

    def no_build(*args, **kwargs):
        raise AssertionError("a refused model was built")

    monkeypatch.setattr(pasta.models.tiny, "build_tiny_model", no_build)
    monkeypatch.setattr(pasta.models.tiny, "twin_config", lambda tokenizer, *args: chunked_config(tokenizer))
    with pytest.raises(PastaError, match=r"model tiny \(model_type qwen3\)"):
        load_model(compose("generate", ["model=tiny", "model.architecture=qwen3"]).model)


def test_a_model_with_attention_sinks_is_refused_before_pasta_attends(tiny_model_and_tokenizer):
    """gpt-oss adds a learned sink logit to every softmax, which pasta's attention functions do not compute: the
    decoder refuses it in one line rather than decode it silently wrong."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    from pasta.decoding import DecodeConfig, decode_sequential

    config = GptOssConfig(vocab_size=len(tiny_model_and_tokenizer[1]), hidden_size=32, intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                          num_local_experts=2, num_experts_per_tok=1, sliding_window=8)
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(PastaError, match=r"^model_type gpt_oss: its attention layers have attention sinks"):
        decode_sequential(model, tiny_model_and_tokenizer[1], [[1, 2, 3]], DecodeConfig(max_new_tokens=2))


def test_stages_that_run_transformers_own_masks_load_any_architecture():
    """The hf teacher and judge (and `pasta.models complete`) read a model through generate() or its plain forward."""
    model, _ = load_model(compose("generate", ["model=tiny", "model.architecture=gemma2"]).model, check=False)
    assert model.config.model_type == "gemma2" and model.config._attn_implementation == "eager"


def test_a_stage_refuses_the_model_in_one_line_before_training(tiny_model_and_tokenizer, tmp_path):
    checkpoint, output_dir = tmp_path / "ckpt", tmp_path / "sft"
    chunked_config(tiny_model_and_tokenizer[1]).save_pretrained(checkpoint)
    tiny_model_and_tokenizer[1].save_pretrained(checkpoint)
    done = subprocess.run(
        [sys.executable, "-m", "pasta.train", "stage=sft", "model=tiny", f"model.path={checkpoint}",
         "model.random_init=null", f"paths.output_root={tmp_path}", f"output_dir={output_dir}", "device=cpu"],
        capture_output=True, text=True,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: model tiny (model_type qwen3): pasta cannot train or decode its attention")
    assert done.stderr.count("\n") == 1 and "chunked_attention layers" in done.stderr
    assert not (output_dir / "checkpoints").exists() and not (output_dir / "final").exists()


def test_an_unknown_random_architecture_is_one_line_naming_the_known_ones():
    with pytest.raises(PastaError, match=r"model.architecture: no tiny twin of 'gpt2' for random_init; known: llama"):
        load_model(compose("generate", ["model=tiny", "model.architecture=gpt2"]).model)


# --- conf/model -----------------------------------------------------------------------------------------------------


def conf_models() -> dict[str, object]:
    return {path.stem: compose("generate", [f"model={path.stem}"]).model
            for path in sorted((conf_dir() / "model").glob("*.yaml"))}


HUB_MODELS = sorted(name for name, cfg in conf_models().items() if cfg.get("hub_id") and not cfg.get("random_init"))


def test_every_hub_model_config_names_an_architecture_whose_twin_the_matrix_runs():
    assert {"gemma-7b", "llama3.1-8b", "qwen2.5-0.5b", "qwen3-0.6b"} <= set(HUB_MODELS)
    for name in HUB_MODELS:
        architecture = compose("generate", [f"model={name}"]).model.architecture
        assert architecture in FAMILIES, name  # tests/test_architecture_matrix.py runs every family


def test_qwen3s_entry_documents_the_real_shape_and_its_random_twin_has_it(tiny_model_and_tokenizer):
    """conf/model/qwen3-0.6b.yaml's numbers, built on the meta device: 0.44B parameters besides the embeddings."""
    from transformers import AutoModelForCausalLM

    comment = (conf_dir() / "model" / "qwen3-0.6b.yaml").read_text()
    assert "28 layers, hidden 1024, 16 query heads and 8 key/value heads of size 128" in comment
    shape = compose("generate", ["model=qwen3-0.6b-random"]).model
    assert shape.architecture == compose("generate", ["model=qwen3-0.6b"]).model.architecture == "qwen3"
    config = model_config(shape, tiny_model_and_tokenizer[1])
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.intermediate_size) == (28, 1024, 16, 8, 128, 3072)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    without_embeddings = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    assert round(without_embeddings / 1e9, 2) == 0.44
    assert model.config.tie_word_embeddings and json.loads(config.to_json_string())["model_type"] == "qwen3"


def test_every_other_conf_model_is_a_random_twin_of_a_family():
    random = {name: cfg for name, cfg in conf_models().items() if name not in HUB_MODELS}
    assert {"tiny", "qwen3-0.6b-random"} <= set(random)
    for name, cfg in random.items():
        assert cfg.random_init is not None and (cfg.architecture or "llama") in FAMILIES, name
