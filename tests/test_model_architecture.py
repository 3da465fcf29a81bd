"""The families pasta runs (the tiny twins of pasta.models.tiny), the conf/model entries they cover, and the refusal of
an attention pasta cannot honour (pasta.models.architecture): one line naming the model type and the feature,
before any weight loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from pasta.config import compose, conf_dir
from pasta.errors import PastaError
from pasta.models import load_model
from pasta.models.architecture import AttentionFeatures, check_architecture
from pasta.models.loading import model_config
from pasta.models.tiny import FAMILIES, TWIN_WINDOW, Sizes, twin_config

REFUSED = {  # what each twin's attention has that pasta does not honour yet
    "gemma2": ["sliding-window attention (a window of 8 tokens on 1 of 2 layers", "attention logit soft-capping (at 50"],
    "gemma3_text": ["sliding-window attention (a window of 8 tokens on 1 of 2 layers"],
    "mistral": ["sliding-window attention (a window of 8 tokens on 2 of 2 layers"],
    "phi3": ["sliding-window attention (a window of 8 tokens on 2 of 2 layers"],
}


def sizes(**changes) -> Sizes:
    return Sizes(**{"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128,
                    "max_position_embeddings": 4096, "head_dim": None, "sliding_window": TWIN_WINDOW, **changes})


@pytest.mark.parametrize("family", FAMILIES)
def test_each_twin_is_refused_for_exactly_the_attention_pasta_does_not_honour(tiny_model_and_tokenizer, family):
    config = twin_config(tiny_model_and_tokenizer[1], family, sizes())
    problems = AttentionFeatures.of(config).unsupported()
    assert len(problems) == len(REFUSED.get(family, []))
    for problem, expected in zip(problems, REFUSED.get(family, []), strict=True):
        assert problem.startswith(expected)
    if family in REFUSED:
        with pytest.raises(PastaError) as refused:
            check_architecture(config, "twin")
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"model twin (model_type {family}): ")
    else:
        check_architecture(config, "twin")


def test_qwen2s_unused_window_and_a_window_as_long_as_the_positions_are_no_window(tiny_model_and_tokenizer):
    tokenizer = tiny_model_and_tokenizer[1]
    qwen2 = twin_config(tokenizer, "qwen2", sizes())
    qwen2.sliding_window = 32768  # Qwen2.5's configs carry one, with use_sliding_window=false: no layer slides
    assert not qwen2.use_sliding_window and set(qwen2.layer_types) == {"full_attention"}
    assert AttentionFeatures.of(qwen2).window_layers == []
    for family in ("mistral", "phi3", "gemma3_text"):
        assert AttentionFeatures.of(twin_config(tokenizer, family, sizes(sliding_window=4096))).unsupported() == []
    softcapped = AttentionFeatures.of(twin_config(tokenizer, "gemma2", sizes(sliding_window=4096))).unsupported()
    assert [problem.split(" (")[0] for problem in softcapped] == ["attention logit soft-capping"]


def test_layer_kinds_other_than_full_and_sliding_are_refused(tiny_model_and_tokenizer):
    config = twin_config(tiny_model_and_tokenizer[1], "qwen3", sizes())
    config.layer_types = ["full_attention", "chunked_attention"]  # Llama 4's local layers, say
    with pytest.raises(PastaError, match=r"model_type qwen3\): .*chunked_attention layers \(pasta's masks know full"):
        check_architecture(config, "twin")


def test_a_refused_model_loads_no_weight(tiny_model_and_tokenizer, tmp_path, monkeypatch):
    """A trained checkpoint's folder (model.path) is read for its config alone: the refusal comes first."""
    tokenizer = tiny_model_and_tokenizer[1]
    twin_config(tokenizer, "gemma3_text", sizes()).save_pretrained(tmp_path)  # a config, no weights at all
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(PastaError, match=r"model ckpt \(model_type gemma3_text\): .*sliding-window attention"):
        load_model({"name": "ckpt", "path": str(tmp_path)})
    import pasta.models.tiny

    def no_build(*args, **kwargs):
        raise AssertionError("a refused model was built")

    monkeypatch.setattr(pasta.models.tiny, "build_tiny_model", no_build)
    with pytest.raises(PastaError, match=r"model tiny \(model_type mistral\)"):
        load_model(compose("generate", ["model=tiny", "model.architecture=mistral"]).model)


def test_stages_that_run_transformers_own_masks_load_any_architecture():
    """The hf teacher and judge (and `pasta.models complete`) read a model through generate() or its plain forward."""
    model, _ = load_model(compose("generate", ["model=tiny", "model.architecture=gemma2"]).model, check=False)
    assert model.config.model_type == "gemma2" and model.config._attn_implementation == "eager"


def test_a_stage_refuses_the_model_in_one_line_before_training(tmp_path):
    output_dir = tmp_path / "sft"
    done = subprocess.run(
        [sys.executable, "-m", "pasta.train", "stage=sft", "model=tiny", "model.architecture=gemma2",
         f"paths.output_root={tmp_path}", f"output_dir={output_dir}", "device=cpu"],
        capture_output=True, text=True,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: model tiny (model_type gemma2): pasta cannot train or decode its attention")
    assert done.stderr.count("\n") == 1 and "sliding-window" in done.stderr and "soft-capping" in done.stderr
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
        assert architecture not in REFUSED, f"{name}: conf/model offers a model pasta refuses"


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
