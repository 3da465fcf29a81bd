"""Multi-process SFT for real: DDP over 2 CPU processes (gloo) through `accelerate launch`, on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import accelerate_launch
from pasta.config import compose
from pasta.training.sft import run_sft

ANNOTATED = Path(__file__).resolve().parents[1] / "data" / "annotated_examples.jsonl"
COMMON = [
    "stage=sft",
    "model=tiny",
    f"data.path={ANNOTATED}",
    "device=cpu",
    "stage.finetune=full",
    "stage.max_steps=2",
    "stage.gradient_accumulation_steps=1",
    "stage.max_length=96",
    "stage.learning_rate=3e-3",
    "stage.logging_steps=1",
    # Length grouping sorts within each process's mega-batches, so its order depends on the number of processes;
    # the plain random order is the same global batches in both runs.
    "stage.group_by_length=false",
    # float32: bf16 autocast (auto on a CPU with bf16 instructions) rounds one batch of 2 and two batches of 1
    # differently, far beyond what tells a wrong global batch apart.
    "stage.mixed_precision=no",
]


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_equals_one_process_with_the_same_global_batch(tmp_path):
    """2 processes x 1 example per step see the same examples per step as 1 process x 2, and DDP averages the
    gradients, so both end with the same weights (full finetuning: no dropout to differ between processes)."""
    done = accelerate_launch(
        "pasta.train", [*COMMON, "stage.per_device_train_batch_size=1", f"output_dir={tmp_path / 'ddp'}"]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((tmp_path / "ddp" / "train_info.json").read_text())
    # Two optimizer steps of a global batch of 2 over 12 examples: a third of an epoch.
    assert info["metrics"]["epoch"] == pytest.approx(2 * 2 / 12)

    single = run_sft(
        compose("train", [*COMMON, "stage.per_device_train_batch_size=2", f"output_dir={tmp_path / 'single'}"])
    )
    expected = load_file(single / "model.safetensors")
    actual = load_file(tmp_path / "ddp" / "final" / "model.safetensors")
    # Gloo's all-reduce sums in another order than one process's backward, and Adam divides by sqrt(v), so a
    # weight whose gradient is near zero can move ~1e-5 apart; a wrong global batch moves weights by ~lr = 3e-3.
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-4)
