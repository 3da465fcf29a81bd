"""`python -m pasta.eval` as a user runs it: an alpaca_eval annotator over an OpenAI-compatible server, resumed
from its cache, and one-line errors for a user's mistakes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from helpers import server_stats, start_chat_server
from helpers.models import cut_checkpoint
from test_eval_quality import make_run, sample_instructions

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_eval(tmp_path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pasta.eval", f"hydra.run.dir={tmp_path / 'hydra'}", *overrides],
        env={**os.environ, **OFFLINE, **(env or {})}, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_alpaca_eval_weighted_gpt4_turbo_annotator_runs_against_a_compatible_server_and_reuses_its_cache(tmp_path):
    instructions = sample_instructions(4)
    run = make_run(tmp_path / "run", "m-async", dict.fromkeys(instructions, "an answer"))
    # The weighted judge reads P("m") (output_1 better) against P("M") from the top logprobs of one token.
    rules = {"default": {"reply": "M", "top_logprobs": {"M": math.log(0.8), "m": math.log(0.2)}}}
    with start_chat_server(tmp_path, rules=rules) as (base_url, _):
        env = {"OPENAI_API_BASE": base_url, "OPENAI_API_KEY": "sk-test"}
        common = ["eval.mode=score", f"output_dir={run}", "eval.annotators_config=weighted_alpaca_eval_gpt4_turbo"]
        first = run_eval(tmp_path, *common, "eval.limit=2", env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        assert server_stats(base_url)["chat_requests"] == 2
        # One more prompt: only its pair is asked for, the first two come from alpaca_eval's cache.
        second = run_eval(tmp_path, *common, "eval.limit=3", env=env)
        assert second.returncode == 0, second.stderr[-2000:]
        assert server_stats(base_url)["chat_requests"] == 3
    results = run / "weighted_alpaca_eval_gpt4_turbo"
    annotations = json.loads((results / "annotations.json").read_text())
    # alpaca_eval shows the two answers in a seeded random order and maps the verdict back: 1.8 or 1.2.
    assert sorted({round(a["preference"], 6) for a in annotations}) <= [1.2, 1.8] and len(annotations) == 3
    quality = json.loads((results / "quality.json").read_text())
    assert quality["annotator"] == "weighted_alpaca_eval_gpt4_turbo" and quality["n_total"] == 3
    assert "win rate:" in second.stdout
    # An endpoint that refuses the key: alpaca_eval re-raises openai's error, which is one line naming the annotator
    # and what the endpoint said, the key left out; the three verdicts cached stay.
    with start_chat_server(tmp_path, rules=rules, fail_first=10, fail_status=401, echo_auth=True) as (base_url, _):
        key = "sk-test-key-2026"  # as long as a key: a shorter value is not masked (pasta.errors)
        refused = run_eval(tmp_path, *common, "eval.limit=4", env={"OPENAI_API_BASE": base_url, "OPENAI_API_KEY": key})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: annotator weighted_alpaca_eval_gpt4_turbo: AuthenticationError: ")
    assert "injected failure (401)" in line and "rerun to resume" in line and key not in refused.stderr
    assert len(json.loads((results / "annotations.json").read_text())) == 3


def test_missing_run_directory_is_one_line_error_with_exit_code_2(tmp_path):
    result = run_eval(tmp_path, "eval.mode=score", f"output_dir={tmp_path / 'nowhere'}", "judge=openai")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "model_outputs.json not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_report_of_a_folder_that_was_never_scored_is_one_line_error(tmp_path):
    (tmp_path / "run").mkdir()
    result = run_eval(tmp_path, f"report=[{tmp_path / 'run'}]", f"output_dir={tmp_path / 'report'}")
    assert result.returncode == 2
    assert "summary.json of" in result.stderr and "Traceback" not in result.stderr


def test_a_truncated_checkpoint_is_one_line_and_writes_nothing_to_output_dir(tiny_model_and_tokenizer, tmp_path):
    """Issue 36: the weights file is named, and output_dir is left as it was (nothing is written before the model
    has loaded)."""
    folder = cut_checkpoint(*tiny_model_and_tokenizer, tmp_path / "final", 0)
    result = run_eval(tmp_path, f"model.path={folder}", "eval.limit=2", "judge=embedding",
                      "eval.win_rate=false", "decode.max_new_tokens=2", f"output_dir={tmp_path / 'eval'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: model.path={folder}: {folder / 'model.safetensors'} is incomplete (0 bytes); copy or "
                      "save the model again"]
    assert not (tmp_path / "eval").exists()
