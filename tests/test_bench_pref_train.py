"""scripts/bench_pref_train.py end to end on the tiny model: every variant trains a round, and the reference scored
once trains to the losses of a reference forward on every step (the same batches)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.scripts import SCRIPTS


@pytest.mark.slow
def test_every_variant_trains_a_round_and_the_reference_scored_once_keeps_the_losses(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_pref_train.py"), "--model", "tiny", "--pairs", "2", "--repeats", "1",
         "--json", str(out), "stage.max_length=128"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["seconds_per_round"]) == ["every step", "scored once", "grouped"]
    assert result["num_pairs"] == 2 and result["overrides"] == ["stage.max_length=128"]
    assert all(seconds > 0 for seconds in result["seconds_per_round"].values())
    assert result["max_loss_difference"] < 1e-3
