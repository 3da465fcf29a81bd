"""The README's main job (`make demo` -> scripts/demo.sh) end to end, on the tiny random model at the smallest sizes:
annotate -> SFT -> Baseline-SFT -> one preference round -> evaluation -> report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs_every_stage_and_prints_the_final_table(tmp_path):
    env = {
        **os.environ,
        "PASTA_VENV": str(Path(sys.executable).parent.parent),
        "PASTA_DEMO_DIR": str(tmp_path / "demo"),
        "PASTA_DEMO_MODEL": "tiny",
        "PASTA_DEMO_RECORDS": "6",
        "PASTA_DEMO_SFT_EPOCHS": "1",
        "PASTA_DEMO_MAX_LENGTH": "192",
        "PASTA_DEMO_PREF_PROMPTS": "2",
        "PASTA_DEMO_SAMPLES": "2",
        "PASTA_DEMO_EVAL_PROMPTS": "2",
        "PASTA_DEMO_MAX_NEW_TOKENS": "12",
    }
    done = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for number in range(1, 9):
        assert f"{number}/8" in done.stdout
    report = json.loads((tmp_path / "demo" / "report" / "report.json").read_text())
    names = {row["name"] for row in report["runs"]}
    assert {"baseline-sft", "pasta-sft", "pasta-pref-round-1"} <= names
    assert "| baseline-sft | sequential |" in done.stdout
    assert (tmp_path / "demo" / "report" / "pareto.png").stat().st_size > 0
    assert "toy run" in done.stdout
