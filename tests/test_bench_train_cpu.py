"""scripts/bench_train_cpu.py end to end on the tiny model: each variant trains, and every variant's loss is the
first one's (the same batches; bf16, no dropout and the CPU LM head change speed, not what is learned)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.scripts import SCRIPTS


@pytest.mark.slow
def test_every_variant_trains_the_same_batches_to_the_same_loss(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_train_cpu.py"), "--model", "tiny", "--steps", "1", "--repeats", "1",
         "--json", str(out),
         # one short sequence a step: the variants' losses compare the same (4 x 2 x 1024 rows took 3x as long)
         "stage.gradient_accumulation_steps=1", "stage.per_device_train_batch_size=1", "stage.max_length=128"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["seconds_per_step"]) == ["before", "bf16", "dropout 0", "cpu head"]
    assert result["overrides"][-1] == "stage.max_length=128"  # recorded with the result
    assert all(seconds > 0 for seconds in result["seconds_per_step"].values())
    losses = [runs[0] for runs in result["last_loss"].values()]
    assert max(losses) - min(losses) < 0.01, losses
