"""scripts/bench_train_cpu.py end to end on the tiny model: each variant trains, and every variant's loss is the
first one's (the same batches; bf16, no dropout and the CPU LM head change speed, not what is learned)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.scripts import SCRIPTS, load_script


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


@pytest.mark.parametrize("script", ["bench_sft.py", "bench_train_cpu.py", "bench_pref_train.py"])
def test_each_cpu_training_benchmark_refuses_a_wrong_input_before_a_model_loads(script):
    done = subprocess.run([sys.executable, str(SCRIPTS / script), "--model", "outputs/sft/final"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: --model=outputs/sft/final: not a model config name (conf/model/: ")


def test_the_cpu_training_benchmarks_check_their_data_and_output_files(tmp_path):
    from pasta.errors import PastaError

    check_inputs = load_script("bench_sft").check_inputs
    for data, json_path, says in ((str(tmp_path / "none.jsonl"), None, f"--data={tmp_path / 'none.jsonl'}: no such"),
                                  (str(SCRIPTS.parent / "data" / "annotated_examples.jsonl"), str(tmp_path),
                                   f"--json={tmp_path} is a folder, not a file")):
        with pytest.raises(PastaError) as info:
            check_inputs("tiny", data, json_path)
        assert str(info.value).startswith(says)
