"""`python -m pasta.generate`: one prompt in, the answer out, as streamed text or one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.models import cut_checkpoint
from pasta.answer import decode_config
from pasta.config import compose
from pasta.errors import PastaError
from pasta.generate import generate

TINY = ["model=tiny", "max_new_tokens=6", "num_threads=1"]


def test_generate_prints_one_json_object_with_text_and_stats(capsys):
    result = generate(compose("generate", [*TINY, "prompt=Give three tips.", "format=json"]))
    payload = json.loads(capsys.readouterr().out)
    for key in ("text", "annotated", "num_tokens", "num_steps", "theoretical_speedup", "wall_s"):
        assert key in payload
    assert payload["decode"] == "async"
    assert payload["text"] == result.text and payload["num_tokens"] == 6


def test_generate_streams_plain_text_and_reports_stats_on_stderr(capsys):
    result = generate(compose("generate", [*TINY, "prompt=Hi", "decode=sequential"]))
    captured = capsys.readouterr()
    assert captured.out == result.text + "\n"
    assert "[sequential] 6 tokens in 6 steps" in captured.err


def test_top_level_shortcut_and_run_seed_reach_the_decode_config():
    config = decode_config(compose("generate", ["max_new_tokens=7", "seed=5", "decode.sampling.temperature=0.5"]))
    assert (config.max_new_tokens, config.sampling.seed, config.sampling.temperature) == (7, 5, 0.5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], 'prompt="..."'),
        (["prompt=x", "decode=sot"], "decode=sot is not one of async, sequential"),
        (["prompt=x", "format=xml"], "format=xml is not one of text, json"),
        (["prompt=x", "decode.sampling.top_p=0"], "top_p"),
    ],
)
def test_bad_settings_are_one_line_errors(overrides, message):
    with pytest.raises(PastaError, match=message):
        generate(compose("generate", [*TINY, *overrides]))


def run_cli(*overrides, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pasta.generate", *TINY, f"hydra.run.dir={tmp_path}", *overrides],
        capture_output=True, text=True, env=env, timeout=300,
    )


def test_missing_checkpoint_is_a_one_line_error(tmp_path):
    with pytest.raises(PastaError, match="is not a folder"):
        generate(compose("generate", [*TINY, "prompt=x", f"model.path={tmp_path / 'missing'}"]))


def test_a_truncated_checkpoint_is_one_line_naming_its_weights_file(tiny_model_and_tokenizer, tmp_path):
    folder = cut_checkpoint(*tiny_model_and_tokenizer, tmp_path / "final", 1000)
    with pytest.raises(PastaError) as info:
        generate(compose("generate", ["prompt=x", f"model.path={folder}", "max_new_tokens=2", "num_threads=1"]))
    assert str(info.value).startswith(f"model.path={folder}: {folder / 'model.safetensors'} is incomplete")


@pytest.mark.slow
def test_cli_prints_json_on_stdout(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pasta.generate", *TINY, "prompt=Name a fruit.", "format=json",
         f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["num_tokens"] == 6 and payload["finish_reason"] == "max_new_tokens"
