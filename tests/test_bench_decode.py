"""scripts/bench_decode.py: its GPU path (models built from real configs with random weights) run on the CPU with the
tiny config, eager against compiled, without the packages the GPU machines lack."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from helpers.scripts import SCRIPTS, load_script

# Absent on the GPU machines: the benchmark's random-weight path must not import them.
ABSENT_ON_GPU_MACHINES = ["trl", "hydra", "omegaconf", "datasets", "alpaca_eval", "antlr4"]


def test_cuda_runs_the_three_real_shapes_on_the_structures_the_issue_names():
    args = load_script("bench_decode").parse_args(["--device", "cuda", "--compile"])
    assert args.models == ["qwen2.5-0.5b", "qwen2.5-7b", "gemma-7b"]
    assert (args.chunks, args.lengths) == ([2, 4], [64])


@pytest.mark.slow
def test_the_tiny_config_runs_eager_and_compiled_end_to_end_without_the_stage_packages(tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--device", "cpu", "--models", "tiny", "--compile", "--chunks", "2", "4", "--lengths", "8",
            "--repeats", "1", "--generate-tokens", "12", "--threads", "1", "--out", str(out)]
    run = (f"import runpy, sys\nfor name in {ABSENT_ON_GPU_MACHINES!r}:\n    sys.modules[name] = None\n"
           f"sys.argv = ['bench_decode.py', *{argv!r}]\n"
           f"runpy.run_path({str(SCRIPTS / 'bench_decode.py')!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"sequential compiled over eager: \d+\.\d\dx", lines[-2]), lines[-2]
    assert re.fullmatch(r"async compiled over eager: \d+\.\d\dx", lines[-1]), lines[-1]
    assert "recompilations after warm-up: 0" in lines
    assert "CUDA graphs recorded after warm-up: 0" in lines  # on CPU none ever is: the count is there for CUDA

    tiny = json.loads(out.read_text())["models"]["tiny"]
    assert tiny["generate"]["same_tokens"] and tiny["compiled_sequential"]["same_tokens"]
    assert set(tiny["recompilations_after_warmup"].values()) == {0}
    assert set(tiny["cuda_graphs_recorded_after_warmup"]) == {"async 2x8", "async 4x8", "sequential"}
    assert set(tiny["compilation"]) == {"c(q)", "async 2x8", "async 4x8", "sequential"}
    for mode in ("eager", "compiled"):
        rows = tiny[f"structures_{mode}"]
        assert [(r["chunks"], r["chunk_tokens"]) for r in rows] == [(2, 8), (4, 8)]
        assert all(r["theoretical_speedup"] > 1 and r["wall_speedup"] > 0 for r in rows)
        costs = tiny[f"forward_costs_{mode}"]["step_costs"]  # the cost model, at the structures' row counts
        assert {1, 2} <= set(costs["rows"]) and all(s > 0 for s in costs["seconds"])
        assert all(r["efficiency"] > 0 and r["machine_bound"] > 0 for r in rows)
        # where a step's time goes, for both decoders: the split a slow compiled step is located with
        assert all(r["ms_per_step"][side]["forward"] > 0 and set(r["ms_per_step"][side]) == {"host", "forward", "choose"}
                   for r in rows for side in ("async", "sequential"))
    assert set(tiny["compiled_over_eager_async"]) == {"2x8", "4x8"}
