"""The CPU study (scripts/cpu_study.sh) end to end on the tiny random model at the smallest sizes, and its resume:
annotate -> SFT -> Baseline-SFT -> a lambda sweep (two lambdas, two rounds: tests/test_train_pref.py checks what rounds
chain) -> the SFT model and each lambda's last round on the same held-out prompts -> report and study plot."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def study_env(out: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PASTA_VENV": str(Path(sys.executable).parent.parent),
        "PASTA_STUDY_DIR": str(out),
        "PASTA_STUDY_MODEL": "tiny",
        "PASTA_STUDY_DATA": "sample",
        "PASTA_STUDY_EVAL_DATA": "sample",
        "PASTA_STUDY_RECORDS": "12",
        "PASTA_STUDY_SFT_ARGS": "stage.max_steps=2 stage.max_length=192",
        "PASTA_STUDY_LAMBDAS": "1 inf",
        "PASTA_STUDY_ROUNDS": "2",
        "PASTA_STUDY_PREF_PROMPTS": "2",
        "PASTA_STUDY_SAMPLES": "2",
        # The tiny Baseline-SFT answers only newlines after 2 steps: a length match with it is 0 for every
        # candidate, so plain similarity (no length control) is what tells the candidates apart.
        "PASTA_STUDY_PREF_ARGS": "stage.max_steps=1 stage.max_length=192 judge.length_control=0",
        "PASTA_STUDY_EVAL_PROMPTS": "2",
        "PASTA_STUDY_TIMED_PROMPTS": "1",
        "PASTA_STUDY_MAX_NEW_TOKENS": "12",
        "PASTA_STUDY_NO_REPEAT": "2",  # not the default (3): the setting, not the default, reaches every decode
    }


@pytest.mark.slow
def test_study_trains_the_sweep_decodes_every_model_on_the_same_prompts_and_resumes(tmp_path):
    """The second run resumes the first: the students it left are skipped (`done_already`, the same check that
    skips a finished round). A third run of the finished study is left out to keep the suite short: the stages' own
    reruns skip finished work (tests/test_train_pref.py::test_a_crashed_round_resumes_without_redoing_finished_work,
    tests/test_eval_generation.py::test_finished_run_is_not_decoded_again)."""
    out = tmp_path / "study"
    script = ["bash", str(ROOT / "scripts" / "cpu_study.sh")]
    # PASTA_STUDY_STOP_AFTER=sft leaves the two students and decodes nothing; the full run then skips them.
    # PASTA_STUDY_BASELINE_SFT_ARGS trains Baseline-SFT unlike the PASTA student.
    trained = subprocess.run(script, env={**study_env(out), "PASTA_STUDY_STOP_AFTER": "sft",
                                          "PASTA_STUDY_BASELINE_SFT_ARGS": "stage.max_steps=1 stage.max_length=192"},
                             capture_output=True, text=True)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert (out / "sft" / "final" / "config.json").is_file() and (out / "baseline-sft" / "final").is_dir()
    trained_steps = {name: json.loads((out / name / "train_info.json").read_text())["config"]["stage"]["max_steps"]
                     for name in ("sft", "baseline-sft")}
    assert trained_steps == {"sft": 2, "baseline-sft": 1}
    assert not (out / "eval").exists() and "stopped after SFT" in trained.stdout
    # By default the chunks write their leads (PASTA_STUDY_TEACHER_ARGS; the measured lever).
    assert json.loads((out / "annotated.summary.json").read_text())["teacher_model"] == "rules-v4 leads_in_main=False"
    done = subprocess.run(script, env=study_env(out), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("   already done: ") == 2
    names = ["baseline-sft", "pasta-sft", "pasta-lambda1-round2", "pasta-lambdainf-round2"]
    # By default (PASTA_STUDY_EVAL_ROUNDS=last) only each lambda's last round is decoded on the held-out prompts.
    assert sorted(path.name for path in (out / "eval").iterdir()) == sorted(names)
    prompts = {}
    for name in names:
        outputs = json.loads((out / "eval" / name / "model_outputs.json").read_text())
        prompts[name] = [o["instruction"] for o in outputs]
    assert len(prompts["pasta-sft"]) == 2 and all(p == prompts["pasta-sft"] for p in prompts.values())
    # Each lambda starts from the SFT model, with its own quality weight.
    metrics = json.loads((out / "pref-lambdainf" / "round-1" / "metrics.json").read_text())
    assert metrics["policy"] == str(out / "sft" / "final")
    assert metrics["quality_weight"] == "inf"
    # The repetition guard reaches every decode: the preference rounds' candidates and both students' evaluations.
    info = json.loads((out / "pref-lambdainf" / "train_info.json").read_text())
    assert info["config"]["stage"]["no_repeat_ngram_size"] == 2
    # So does the skeleton draft (PASTA_STUDY_DRAFT=1 by default): the rounds' speed reward counts drafted steps.
    assert info["config"]["stage"]["draft_skeleton"] is True
    for name in ("baseline-sft", "pasta-sft"):
        run = json.loads((out / "eval" / name / "run.json").read_text())
        assert run["decoding"]["sampling"]["no_repeat_ngram_size"] == 2
        # The PASTA models decode with the skeleton draft (PASTA_STUDY_DRAFT=1 by default).
        assert run["decoding"]["draft_skeleton"] == (name == "pasta-sft")
    # Round 1 samples the same candidates for every lambda: the second lambda reused the first one's, and both
    # scored them against Baseline-SFT's answers.
    shared = [(out / f"pref-lambda{lam}" / "round-1" / "scores.jsonl").read_text() for lam in ("1", "inf")]
    assert shared[0] == shared[1]
    assert f"stage.candidates_from={out / 'pref-lambda1'}: took the 2 scored prompts of its round 1" in done.stdout + done.stderr
    # Baseline-SFT answers only the prompts the rounds sample (2 rounds x 2 prompts), not all 12 records.
    assert len((out / "pref-lambda1" / "baseline_answers.jsonl").read_text().splitlines()) == 4
    stats = [json.loads(line) for line in (out / "eval" / "pasta-sft" / "stats.jsonl").read_text().splitlines()]
    # One timed prompt, then a batch of the one left: decoded alone too, but not timed (no warm-up before it).
    assert [(r["batch_size"], r["timed_alone"]) for r in stats] == [(1, True), (1, False)]
    assert (out / "eval" / "baseline-sft" / "step_costs.json").is_file()
    assert "| pasta-lambdainf-round2 |" in done.stdout and "(proxy)" in done.stdout
    assert "cost-model speedup" in done.stdout
    assert (out / "report" / "study.png").stat().st_size > 0


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("PASTA_STUDY_LAMBDAS", "1 abc", "PASTA_STUDY_LAMBDAS: 'abc' is not a number >= 0 or inf"),
    ("PASTA_STUDY_ROUNDS", "0", "PASTA_STUDY_ROUNDS=0 must be an integer >= 1"),
    ("PASTA_STUDY_ROUNDS", "x", "PASTA_STUDY_ROUNDS=x must be an integer >= 1"),
    ("PASTA_STUDY_EVAL_PROMPTS", "99999", "PASTA_STUDY_EVAL_PROMPTS=99999 must be an integer in 1..25 (eval_data"),
    ("PASTA_STUDY_TIMED_PROMPTS", "3", "PASTA_STUDY_TIMED_PROMPTS=3 must be an integer in 0..2"),
    ("PASTA_STUDY_PREF_ARGS", "stage.alpha=2", "PASTA_STUDY_LAMBDAS / PASTA_STUDY_PREF_ARGS: stage.alpha: must be in [0, 1], got 2.0"),
    ("PASTA_STUDY_BASELINE_SFT_ARGS", "stage=pref", "PASTA_STUDY_BASELINE_SFT_ARGS: overrides the stage"),
    ("PASTA_STUDY_STOP_AFTER", "pref", "PASTA_STUDY_STOP_AFTER=pref: use sft"),
    ("PASTA_STUDY_EVAL_ROUNDS", "first", "PASTA_STUDY_EVAL_ROUNDS=first: use last"),
    ("PASTA_STUDY_NO_REPEAT", "-1", "PASTA_STUDY_NO_REPEAT=-1 must be an integer >= 0 (0 = off)"),
    ("PASTA_STUDY_DRAFT", "2", "PASTA_STUDY_DRAFT=2 must be an integer in 0..1 (1 = the skeleton draft, 0 = off)"),
    ("PASTA_STUDY_TEACHER_ARGS", "teacher.topic_words=0", "PASTA_STUDY_MODEL / PASTA_STUDY_DATA / PASTA_STUDY_RECORDS / "
                                                          "PASTA_STUDY_TEACHER_ARGS: teacher.topic_words: must be >= 1"),
])
def test_the_study_checks_every_setting_before_its_first_step(tmp_path, setting, value, says):
    """Issue 36: a bad setting is one line and exit code 2 before step 1, not a failure hours in at its step."""
    out = tmp_path / "study"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_study.sh")], env={**study_env(out), setting: value},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {says}")
    assert "== [" not in done.stdout and not out.exists()



def test_the_study_evaluates_on_alpaca_eval_inside_the_held_out_pool_only(tmp_path, shared_data_dir):
    """Beyond the pool's 300 prompts the study's default data (alpaca_eval_gpt4_mix) trains on the evaluated ones."""
    out = tmp_path / "study"
    env = {**study_env(out), "PASTA_STUDY_EVAL_DATA": "alpaca_eval", "PASTA_STUDY_EVAL_PROMPTS": "301"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_study.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.strip() == ("error: PASTA_STUDY_EVAL_PROMPTS=301 must be an integer in 1..300 (the held-out "
                                   "pool of eval_data=alpaca_eval: data=alpaca_eval_gpt4* trains on the others)")
