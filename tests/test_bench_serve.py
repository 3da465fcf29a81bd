"""scripts/bench_serve.py refuses what its servers would refuse, before it starts them (each takes seconds to minutes
to load a model)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.scripts import SCRIPTS


@pytest.mark.parametrize(("flags", "says"), [
    (["--model-path", "{tmp}/nowhere"], "--model-path={tmp}/nowhere is not a folder"),
    (["--override", "model=tiny", "decode.sampling.top_p=3"], "decode.sampling.top_p: must be in (0, 1], got 3.0"),
    (["--override", "model=tiny", "--prompts", "{tmp}/none.jsonl"], "--prompts={tmp}/none.jsonl: no such file"),
    (["--override", "model=tiny", "--out", "{tmp}"], "--out={tmp} is a folder, not a file"),
])
def test_a_bad_input_is_one_error_before_any_server_starts(tmp_path, flags, says):
    prompts = ["--prompts", str(SCRIPTS.parent / "data" / "eval_sample.jsonl")]
    args = [flag.format(tmp=tmp_path) for flag in [*prompts, *flags]]
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_serve.py"), *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {says.format(tmp=tmp_path)}")
