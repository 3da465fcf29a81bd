"""Entry points as a user runs them, in a subprocess from a directory that is not the checkout: `--help`,
`--cfg job`, the run directory, and one-line errors with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

SRC = Path(__file__).resolve().parents[1] / "src" / "pasta"
ENTRY_MODULES = ("pasta.annotate", "pasta.train", "pasta.eval", "pasta.generate", "pasta.lang")
# pasta.lang is an argparse tool for annotation authors, not a Hydra stage: it has --help but no --cfg.
HYDRA_MODULES = ENTRY_MODULES[:4]
# Overrides a module needs before its config composes (a required group choice).
REQUIRED_OVERRIDES = {"pasta.train": ["stage=sft"]}


def _module_exists(module: str) -> bool:
    name = module.split(".", 1)[1]
    return (SRC / f"{name}.py").is_file() or (SRC / name / "__main__.py").is_file()


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def _skip_if_missing(module: str) -> None:
    if not _module_exists(module):
        pytest.skip(f"{module} is not written yet")


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_entry_point_help_works_from_another_directory(module, tmp_path):
    _skip_if_missing(module)
    result = _run(["-m", module, "--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize("module", HYDRA_MODULES)
def test_entry_point_prints_its_composed_config_from_another_directory(module, tmp_path):
    _skip_if_missing(module)
    result = _run(["-m", module, "--cfg", "job", *REQUIRED_OVERRIDES.get(module, [])], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert cfg["model"]["name"] == "smollm2-135m" and "paths" in cfg and "seed" in cfg


FAKE_STAGE = textwrap.dedent('''
    """A stand-in stage built like the real ones: a plain function plus run_entry."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from pasta.cli import run_entry
    from pasta.errors import PastaError


    def fake_stage(cfg):
        if cfg.get("fail") == "pasta":
            raise PastaError("bad input: the thing is wrong")
        if cfg.get("fail") == "missing":
            open(cfg.paths.data_dir + "/no-such-file.jsonl")
        if cfg.get("fail") == "bug":
            raise RuntimeError("a real bug")
        Path(cfg.marker).write_text(HydraConfig.get().runtime.output_dir)


    main = run_entry(fake_stage, "generate")

    if __name__ == "__main__":
        main()
''')


@pytest.fixture
def fake_stage(tmp_path):
    """A module `fake_stage` on PYTHONPATH and an empty working directory to run it from."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "fake_stage.py").write_text(FAKE_STAGE)
    workdir = tmp_path / "work"
    workdir.mkdir()

    def run(*overrides: str) -> subprocess.CompletedProcess:
        return _run(["-m", "fake_stage", f"paths.output_root={tmp_path / 'out'}", *overrides], cwd=workdir,
                    PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "mod"), os.environ.get("PYTHONPATH")])))

    return run, tmp_path


def test_run_entry_runs_the_task_in_a_run_dir_under_output_root(fake_stage):
    run, tmp_path = fake_stage
    marker = tmp_path / "marker.txt"
    result = run(f"+marker={marker}")
    assert result.returncode == 0, result.stderr
    run_dir = Path(marker.read_text())
    assert run_dir.parent == tmp_path / "out" / "runs" / "fake_stage"
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert list((tmp_path / "work").iterdir()) == []  # nothing written where the user stands


@pytest.mark.parametrize(("fail", "message"), [
    ("pasta", "error: bad input: the thing is wrong"),
    ("missing", "error: file not found: "),
])
def test_user_errors_are_one_line_with_exit_code_2(fake_stage, fail, message):
    run, _ = fake_stage
    result = run(f"+fail={fail}")
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_bug_still_shows_its_traceback(fake_stage):
    run, _ = fake_stage
    result = run("+fail=bug")
    assert result.returncode == 1
    assert "RuntimeError: a real bug" in result.stderr


def test_unknown_config_option_is_one_line_with_exit_code_2_and_no_run_dir(fake_stage):
    run, tmp_path = fake_stage
    result = run("model=no-such-model")
    assert result.returncode == 2
    assert result.stderr.startswith("error: model: no option 'no-such-model' (choose from ")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_run_entry_cfg_job_shows_overrides(fake_stage):
    run, _ = fake_stage
    result = run("model=tiny", "seed=7", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert cfg["model"]["name"] == "tiny" and cfg["seed"] == 7


@pytest.mark.slow
def test_models_prepare_prints_the_cached_folder_and_complete_answers(tmp_path):
    prepared = _run(["-m", "pasta.models", "prepare", "model=tiny"], cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    assert Path(prepared.stdout.strip(), "config.json").is_file()
    answered = _run(["-m", "pasta.models", "complete", "model=tiny", "--prompt", "Hi", "--max-new-tokens", "3"],
                    cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.startswith("user: Hi\nassistant:")


def test_models_cli_reports_a_bad_model_path_in_one_line(tmp_path):
    result = _run(["-m", "pasta.models", "prepare", f"model.path={tmp_path / 'nowhere'}"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: model.path={tmp_path / 'nowhere'} is not a folder"


def test_a_failed_child_command_is_reported_by_its_own_error_line():
    from pasta.cli import child_error

    log = "loading...\nerror: model.path=/x is not a folder\n"
    assert child_error(log) == "model.path=/x is not a folder"
    assert child_error("a\nerror: first\nlater\nerror: second\n") == "second"
    assert child_error("Traceback (most recent call last):\n  ...\nValueError: boom\n") == "ValueError: boom"
    assert child_error("") == "no output"
