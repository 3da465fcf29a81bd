"""Where a stage writes: an output path that cannot be written (a file where a folder is wanted or the reverse, a file
on the way, a read-only place, something that is not a regular file) is one `<key>=<path>: <why>` error before the
stage loads anything, and a write that fails during a run (the disk full) is one `error:` line that names the file,
with every line written before it kept."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from pasta.annotate import annotate
from pasta.config import compose
from pasta.data import read_jsonl
from pasta.errors import PastaError
from pasta.eval import evaluate
from pasta.train import train

ROOT = Path(__file__).resolve().parents[1]
# sysfs refuses new files even to root, for whom permission bits on a folder of its own mean nothing.
READ_ONLY = Path("/sys/pasta-output-test")


def needs_read_only_place() -> None:
    if not Path("/sys").is_dir():
        pytest.skip("no /sys here: no place that refuses writes to every user")


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a folder\n")
    return path


def run_eval(output_dir: Path) -> None:
    evaluate(compose("eval", ["model=tiny", f"output_dir={output_dir}", "eval.limit=1", "judge=embedding",
                              "eval.win_rate=false", "decode.max_new_tokens=2"]))


def run_train(output_dir: Path) -> None:
    # Data that trains: without the check the run gets as far as making its checkpoints folder.
    train(compose("train", ["stage=sft", "model=tiny", f"data.path={ROOT / 'data' / 'annotated_examples.jsonl'}",
                            f"output_dir={output_dir}"]))


@pytest.mark.parametrize("stage", [run_eval, run_train], ids=["eval", "train"])
def test_an_output_dir_that_cannot_be_a_folder_is_one_error_naming_it(stage, a_file):
    with pytest.raises(PastaError, match=f"^output_dir={a_file} is a file, not a folder$"):
        stage(a_file)
    with pytest.raises(PastaError, match=f"^output_dir={a_file}/sub: {a_file} is a file, not a folder$"):
        stage(a_file / "sub")
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.parametrize("stage", [run_eval, run_train], ids=["eval", "train"])
def test_an_output_dir_in_a_read_only_place_is_one_error_naming_it(stage):
    needs_read_only_place()
    with pytest.raises(PastaError, match=f"^output_dir={READ_ONLY}: cannot write in /sys \\(.+\\)$"):
        stage(READ_ONLY)


def run_annotate(output: Path | str, *extra: str) -> dict:
    return annotate(compose("annotate", ["model=tiny", f"output={output}", "progress=false", *extra]))


def test_an_annotate_output_that_cannot_be_a_file_is_one_error_naming_it(tmp_path, a_file):
    with pytest.raises(PastaError, match=f"^output={tmp_path} is a folder, not a file$"):
        run_annotate(tmp_path)
    with pytest.raises(PastaError, match=f"^output={a_file}/x.jsonl: {a_file} is a file, not a folder$"):
        run_annotate(a_file / "x.jsonl")
    with pytest.raises(PastaError, match="^output=/dev/full is not a regular file$"):
        run_annotate("/dev/full")
    assert not Path("/dev/full.rejects.jsonl").exists()
    needs_read_only_place()
    with pytest.raises(PastaError, match=f"^output={READ_ONLY}/x.jsonl: cannot write in /sys \\(.+\\)$"):
        run_annotate(READ_ONLY / "x.jsonl")


def test_an_output_root_under_a_file_is_one_line_before_hydra_makes_its_run_folder(tmp_path, a_file):
    result = subprocess.run([sys.executable, "-m", "pasta.generate", "model=tiny", "prompt=Hi", "max_new_tokens=2",
                             f"paths.output_root={a_file}/out"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert (result.returncode, result.stderr.strip()) == (
        2, f"error: paths.output_root={a_file}/out: {a_file} is a file, not a folder")


def limit_file_size(num_bytes: int):
    """A preexec_fn: every file the process writes stops at `num_bytes` (EFBIG, as a full disk stops it with
    ENOSPC); Python ignores the SIGXFSZ that comes with it."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (num_bytes, num_bytes))


@pytest.mark.slow
def test_a_write_that_fails_mid_run_is_one_line_and_keeps_every_line_written_before(tmp_path):
    output = tmp_path / "ann.jsonl"
    command = [sys.executable, "-m", "pasta.annotate", "model=tiny", f"output={output}", "progress=false",
               f"paths.output_root={tmp_path / 'runs'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    stopped = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                             preexec_fn=limit_file_size(16_384))
    assert stopped.returncode == 2, stopped.stderr
    assert stopped.stderr.strip() == f"error: {output}: File too large"
    kept = read_jsonl(output)  # every line whole (a half-written one would not parse)
    assert len(kept) > 0 and output.stat().st_size <= 16_384
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr
    ids = [r["id"] for path in (output, tmp_path / "ann.rejects.jsonl") for r in read_jsonl(path)]
    sample = read_jsonl(ROOT / "data" / "alpaca_sample.jsonl")
    assert len(ids) == len(set(ids)) == len(sample)
    assert [r["id"] for r in read_jsonl(output)][: len(kept)] == [r["id"] for r in kept]
