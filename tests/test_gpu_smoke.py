"""scripts/gpu_smoke.py, the first thing to run on a GPU, on its CPU path: every stage on the tiny Qwen3 twin."""

from __future__ import annotations

import json

import pytest

from helpers.scripts import load_script


@pytest.mark.slow
def test_the_gpu_smoke_runs_every_stage_on_the_cpu(tmp_path):
    out = tmp_path / "smoke"
    (out / "stale").mkdir(parents=True)  # an earlier run's leftovers: the smoke starts from nothing
    load_script("gpu_smoke").main(["--device", "cpu", "--no-compile", "--out", str(out)])
    record = json.loads((out / "smoke.json").read_text())
    assert not (out / "stale").exists()
    stages = {stage["stage"].split(",")[0].split(":")[0]: stage for stage in record["stages"]}
    assert list(stages) == [
        "annotate the sample (structural teacher)", "SFT", "Baseline-SFT", "one preference round (async sampling",
        "fork parity", "evaluate Baseline-SFT", "evaluate the preference model", "serve",
    ]
    assert stages["annotate the sample (structural teacher)"]["with_promises"] > 0
    assert stages["SFT"]["status"] == stages["Baseline-SFT"]["status"] == "done"
    assert stages["one preference round (async sampling"]["num_pairs"] > 0
    parity = stages["fork parity"]
    assert parity["float32"]["threads"] == 2 and parity["float32"]["max_token_diff"] <= 1e-3
    assert parity["bfloat16"]["max_token_diff"] <= 1.0
    assert stages["evaluate the preference model"]["answers"] == 2
    assert stages["serve"]["status"] == 200 and stages["serve"]["completion_tokens"] > 0
    assert record["device"]["device"] == "cpu" and record["compile"] is False and "torch" in record["device"]


def test_the_gpu_smoke_refuses_cuda_where_torch_sees_none(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as exited:
        load_script("gpu_smoke").main(["--device", "cuda", "--out", str(tmp_path / "smoke")])
    assert exited.value.code == 2 and not (tmp_path / "smoke").exists()
    error = capsys.readouterr().err
    assert error.startswith("error: --device cuda: this torch") and error.count("\n") == 1
