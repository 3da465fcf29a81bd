"""Quality scoring through alpaca_eval: re-scoring saved annotations, the pasta judge as an alpaca_eval annotator
(resume after a failure), and the checks on outputs and reference files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from helpers import server_stats, start_chat_server
from pasta.config import compose
from pasta.errors import PastaError
from pasta.eval import evaluate
from pasta.evaluation.quality import JudgeAnnotator, make_metric_fn

FIXTURE_ANNOTATIONS = "alpaca_eval_fixtures/alpaca-7b__weighted_alpaca_eval_gpt4_turbo__annotations.json"
LEADERBOARD = "alpaca_eval_fixtures/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def no_judge(monkeypatch):
    """Fail the test if anything builds a judge."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a judge was built")

    monkeypatch.setattr("pasta.judges.build_judge", refuse)


# ------------------------------------------------------------------------------------ re-scoring annotations


def test_rescoring_alpaca_7b_annotations_gives_the_leaderboard_win_rate(shared_data_dir, tmp_path, no_judge):
    cfg = compose("eval", ["eval_data=alpaca_eval", f"eval.annotations={shared_data_dir / FIXTURE_ANNOTATIONS}",
                           f"output_dir={tmp_path}"])
    result = evaluate(cfg)
    quality = result["summary"]["quality"]
    leaderboard = pd.read_csv(shared_data_dir / LEADERBOARD, index_col=0)
    assert round(quality["win_rate"], 2) == 2.59
    assert quality["win_rate"] == pytest.approx(leaderboard.loc["alpaca-7b", "win_rate"], abs=1e-9)
    assert quality["standard_error"] == pytest.approx(leaderboard.loc["alpaca-7b", "standard_error"], abs=1e-9)
    assert (quality["n_total"], quality["n_wins"], quality["reference"]) == (805, 17, "gpt4_1106_preview")
    # Offline there is no official LC, and none is invented.
    assert "length_controlled_winrate" not in quality
    assert "df_gamed.csv" in quality["lc_unavailable"]
    saved = json.loads((tmp_path / "weighted_alpaca_eval_gpt4_turbo" / "quality.json").read_text())
    assert saved["win_rate"] == quality["win_rate"]
    assert (tmp_path / "summary.md").read_text().count("2.59") >= 1


def test_offline_lc_estimate_is_labelled_as_not_comparable(shared_data_dir, tmp_path, no_judge):
    cfg = compose("eval", ["eval_data=alpaca_eval", f"eval.annotations={shared_data_dir / FIXTURE_ANNOTATIONS}",
                           f"output_dir={tmp_path}", "eval.length_controlled=offline"])
    quality = evaluate(cfg)["summary"]["quality"]
    assert "length_controlled_winrate" not in quality
    assert 0 < quality["lc_winrate_offline_estimate"] < 100
    assert "NOT comparable" in quality["lc_method"]
    assert quality["comparable_with_leaderboard"] is False


def test_official_lc_without_the_hub_is_a_clear_error(shared_data_dir, tmp_path):
    cfg = compose("eval", ["eval_data=alpaca_eval", f"eval.annotations={shared_data_dir / FIXTURE_ANNOTATIONS}",
                           f"output_dir={tmp_path}", "eval.length_controlled=official"])
    with pytest.raises(PastaError, match="length_controlled=official, but alpaca_eval's df_gamed.csv"):
        evaluate(cfg)


def test_annotations_file_that_is_not_alpaca_eval_annotations_is_a_clear_error(tmp_path):
    bad = tmp_path / "annotations.json"
    bad.write_text(json.dumps([{"instruction": "x", "output": "y"}]))
    cfg = compose("eval", [f"eval.annotations={bad}", f"output_dir={tmp_path / 'out'}"])
    with pytest.raises(PastaError, match="row 1: not an alpaca_eval annotation .missing output_1"):
        evaluate(cfg)


# ------------------------------------------------------------------------------- the pasta judge, resumable


class CountingJudge:
    """A judge double: prefers answers containing "BEST"; raises after `fail_after` calls to compare."""

    name = "counting-judge"

    def __init__(self, fail_after: int | None = None):
        self.fail_after = fail_after
        self.judged: list[str] = []

    def compare(self, items):
        if self.fail_after is not None and len(self.judged) >= self.fail_after:
            raise ConnectionError("judge server went away")
        self.judged.extend(item.instruction for item in items)
        return [1.0 if "BEST" in item.candidate else 0.25 for item in items]


def outputs(generator: str, answers: dict[str, str]) -> list[dict]:
    return [{"instruction": i, "output": o, "generator": generator, "dataset": "test"} for i, o in answers.items()]


def test_judge_failing_midway_keeps_finished_pairs_and_resume_judges_only_the_rest(tmp_path, capsys):
    instructions = [f"question {n}" for n in range(5)]
    model = outputs("model", {q: ("BEST answer" if n % 2 == 0 else "meh") for n, q in enumerate(instructions)})
    reference = outputs("reference", dict.fromkeys(instructions, "a reference answer"))
    pairs_path = tmp_path / "judge_pairs.jsonl"

    failing = CountingJudge(fail_after=2)
    annotator = JudgeAnnotator("counting-judge", judge=failing, pairs_path=pairs_path, chunk_size=1)
    try:
        annotator.annotate_head2head(reference, model)
    except PastaError as exc:
        error = exc  # held, with its traceback and the frames in it, as pasta.cli holds it while it prints
    assert re.search(r"failed after 2 of 5 pairs .*rerun to resume", str(error))
    # The progress bar ended its line: the `error:` line pasta.cli prints next starts a line of its own.
    assert capsys.readouterr().err.endswith("\n")
    assert len(pairs_path.read_text().splitlines()) == 2
    with pairs_path.open("a") as handle:  # and a kill cut the next verdict short
        handle.write('{"key": "3f2a", "annot')

    resumed = CountingJudge()
    rows = JudgeAnnotator("counting-judge", judge=resumed, pairs_path=pairs_path, chunk_size=2).annotate_head2head(
        reference, model
    )
    assert resumed.judged == instructions[2:]
    assert [row["preference"] for row in rows] == [2.0, 1.25, 2.0, 1.25, 2.0]
    assert {row["generator_1"] for row in rows} == {"reference"} and {row["generator_2"] for row in rows} == {"model"}


def test_pairs_the_judge_gave_up_on_are_asked_again_on_a_rerun(tmp_path):
    class GivingUpJudge(CountingJudge):
        def compare(self, items):
            self.judged.extend(item.instruction for item in items)
            return [None for _ in items]

    pairs_path = tmp_path / "judge_pairs.jsonl"
    reference, model = outputs("reference", {"q": "ref"}), outputs("model", {"q": "BEST"})
    rows = JudgeAnnotator("counting-judge", judge=GivingUpJudge(), pairs_path=pairs_path).annotate_head2head(
        reference, model)
    assert rows[0]["preference"] is None
    judge = CountingJudge()
    rows = JudgeAnnotator("counting-judge", judge=judge, pairs_path=pairs_path).annotate_head2head(reference, model)
    assert judge.judged == ["q"] and rows[0]["preference"] == 2.0


def test_identical_answers_tie_without_asking_the_judge(tmp_path):
    judge = CountingJudge()
    rows = JudgeAnnotator("counting-judge", judge=judge, pairs_path=tmp_path / "pairs.jsonl").annotate_head2head(
        outputs("reference", {"q": "same BEST text"}), outputs("model", {"q": "same BEST text"}))
    assert judge.judged == [] and rows[0]["preference"] == 1.5


def test_changed_candidate_answer_is_judged_again(tmp_path):
    pairs_path = tmp_path / "judge_pairs.jsonl"
    reference = outputs("reference", {"q": "ref"})
    JudgeAnnotator("counting-judge", judge=CountingJudge(), pairs_path=pairs_path).annotate_head2head(
        reference, outputs("model", {"q": "meh"}))
    judge = CountingJudge()
    rows = JudgeAnnotator("counting-judge", judge=judge, pairs_path=pairs_path).annotate_head2head(
        reference, outputs("model", {"q": "BEST now"}))
    assert judge.judged == ["q"] and rows[0]["preference"] == 2.0


def test_verdicts_of_another_judge_are_not_reused(tmp_path):
    pairs_path = tmp_path / "judge_pairs.jsonl"
    reference, model = outputs("reference", {"q": "ref"}), outputs("model", {"q": "a"})
    JudgeAnnotator("judge-a", judge=CountingJudge(), pairs_path=pairs_path).annotate_head2head(reference, model)
    with pytest.raises(PastaError, match="holds verdicts of 'judge-a', not of 'judge-b'"):
        JudgeAnnotator("judge-b", judge=CountingJudge(), pairs_path=pairs_path).annotate_head2head(reference, model)


def test_verdicts_of_the_same_judge_name_under_other_settings_are_not_reused(tmp_path):
    """hf:smollm2-135m names the judge's model config, not the checkpoint at judge.model.path or its prompts."""
    from pasta.evaluation.judge_annotator import judge_settings

    base = compose("eval", ["judge=hf"]).judge
    other = compose("eval", ["judge=hf", "judge.compare_prompt=my_compare.md"]).judge
    faster = compose("eval", ["judge=hf", "judge.batch_size=64", "judge.device=cpu"]).judge
    assert judge_settings(base) != judge_settings(other) and judge_settings(base) == judge_settings(faster)
    pairs_path = tmp_path / "judge_pairs.jsonl"
    reference, model = outputs("reference", {"q": "ref"}), outputs("model", {"q": "a"})
    JudgeAnnotator("hf:smollm2-135m", judge=CountingJudge(), pairs_path=pairs_path,
                   settings=judge_settings(base)).annotate_head2head(reference, model)
    again = CountingJudge()
    JudgeAnnotator("hf:smollm2-135m", judge=again, pairs_path=pairs_path,
                   settings=judge_settings(faster)).annotate_head2head(reference, model)
    assert again.judged == []  # the same verdicts: reused
    with pytest.raises(PastaError, match="under other judge settings"):
        JudgeAnnotator("hf:smollm2-135m", judge=CountingJudge(), pairs_path=pairs_path,
                       settings=judge_settings(other)).annotate_head2head(reference, model)


def test_unjudged_pairs_are_dropped_from_the_win_rate_and_counted():
    frame = pd.DataFrame({
        "instruction": list("abcd"), "output_1": ["r"] * 4, "output_2": ["o"] * 4,
        "generator_1": ["ref"] * 4, "generator_2": ["m"] * 4, "preference": [2.0, 1.0, None, 1.5],
    })
    metrics = make_metric_fn(None, "off")(frame)
    assert metrics["win_rate"] == pytest.approx(50.0)
    assert (metrics["n_total"], metrics["n_unjudged"]) == (3, 1)


# --------------------------------------------------------------- a run directory scored end to end


def make_run(run_dir: Path, generator: str, answers: dict[str, str], decode: str = "async") -> Path:
    """A run directory as generation writes it: run.json, model_outputs.json, stats.jsonl."""
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {"generator": generator, "decode": decode, "timing": "wall", "device": "cpu test", "model": "tiny"}
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "model_outputs.json").write_text(json.dumps(outputs(generator, answers)))
    with (run_dir / "stats.jsonl").open("w") as handle:
        for n, instruction in enumerate(answers):
            steps = 50 if decode == "async" else 100
            record = {"instruction": instruction, "output": answers[instruction], "wall_s": 0.5 + 0.1 * n if decode == "async" else 1.0 + 0.1 * n,
                      "num_tokens": 100, "num_steps": steps, "theoretical_speedup": 100 / steps}
            handle.write(json.dumps(record) + "\n")
    return run_dir


def sample_instructions(n: int) -> list[str]:
    return [json.loads(line)["instruction"] for line in Path("data/eval_sample.jsonl").read_text().splitlines()[:n]]


JUDGE_RULES = {
    # Whichever answer contains BEST wins; otherwise the judge says "1", a position bias that both orders cancel.
    "rules": [{"regex": r"## Answer 1\n[^\n]*BEST", "reply": "1"}, {"regex": r"## Answer 2\n[^\n]*BEST", "reply": "2"}],
    "default": "1",
}


def openai_judge_overrides(base_url: str) -> list[str]:
    return ["judge=openai", f"judge.base_url={base_url}", "judge.api_key_env=null", "judge.model=test-model",
            "judge.progress=false", "judge.max_retries=0"]


def test_run_outputs_are_scored_through_alpaca_eval_with_a_pasta_judge(tmp_path):
    instructions = sample_instructions(4)
    run = make_run(tmp_path / "run", "sft-async", {q: ("BEST" if n < 2 else "plain") for n, q in enumerate(instructions)})
    baseline = make_run(tmp_path / "base", "base-sequential", dict.fromkeys(instructions, "baseline"), "sequential")
    with start_chat_server(tmp_path, rules=JUDGE_RULES) as (base_url, _):
        cfg = compose("eval", ["eval.mode=score", "eval.limit=4", f"output_dir={run}", f"eval.reference={baseline}",
                               f"eval.sequential={baseline}", "eval.bootstrap.num_resamples=200",
                               *openai_judge_overrides(base_url)])
        summary = evaluate(cfg)["summary"]
        requests = server_stats(base_url)["chat_requests"]
    quality, speed = summary["quality"], summary["speed"]
    # Two wins (preference 2) and two ties (1.5): 75%.
    assert quality["win_rate"] == pytest.approx(75.0)
    assert (quality["annotator"], quality["reference"], quality["n_total"]) == ("openai:test-model", "base-sequential", 4)
    annotations = json.loads((run / "openai-test-model" / "annotations.json").read_text())
    assert sorted(a["preference"] for a in annotations) == [1.5, 1.5, 2.0, 2.0]
    assert requests == 8  # both orders of 4 pairs
    expected = (2.0 * 1.1 / 0.6 * 1.2 / 0.7 * 1.3 / 0.8) ** 0.25  # sequential 1.0 + 0.1 n s, async 0.5 + 0.1 n s
    assert speed["wall_speedup_geomean"]["value"] == pytest.approx(expected)
    assert speed["theoretical_speedup_geomean"]["value"] == pytest.approx(2.0)
    assert json.loads((run / "summary.json").read_text())["quality"]["win_rate"] == pytest.approx(75.0)

    # Scoring again asks the judge nothing: every pair is in judge_pairs.jsonl.
    with start_chat_server(tmp_path, rules=JUDGE_RULES) as (base_url, _):
        cfg = compose("eval", ["eval.mode=score", "eval.limit=4", f"output_dir={run}", f"eval.reference={baseline}",
                               *openai_judge_overrides(base_url)])
        assert evaluate(cfg)["summary"]["quality"]["win_rate"] == pytest.approx(75.0)
        assert server_stats(base_url)["chat_requests"] == 0


def test_outputs_missing_instructions_name_the_file_and_the_first_missing_one(tmp_path, no_judge):
    instructions = sample_instructions(3)
    run = make_run(tmp_path / "run", "m-async", {q: "x" for q in instructions[:2]})
    cfg = compose("eval", ["eval.mode=score", "eval.limit=3", f"output_dir={run}"])
    with pytest.raises(PastaError, match=rf"model_outputs.json lacks 1 of the 3 .*{instructions[2][:20]}"):
        evaluate(cfg)


def test_outputs_of_another_model_are_rejected(tmp_path, no_judge):
    run = make_run(tmp_path / "run", "m-async", dict.fromkeys(sample_instructions(2), "x"))
    (run / "run.json").write_text(json.dumps({"generator": "other-model", "decode": "async", "timing": "wall"}))
    cfg = compose("eval", ["eval.mode=score", "eval.limit=2", f"output_dir={run}"])
    with pytest.raises(PastaError, match="outputs of 'm-async', but this run is 'other-model'"):
        evaluate(cfg)


def test_outputs_from_another_data_set_are_rejected(tmp_path, no_judge):
    run = make_run(tmp_path / "run", "m-async", {"What is not in the sample?": "x"})
    cfg = compose("eval", ["eval.mode=score", "eval.limit=1", f"output_dir={run}"])
    with pytest.raises(PastaError, match="1 instructions that are not in the evaluation set"):
        evaluate(cfg)


def test_reference_run_lacking_instructions_is_rejected(tmp_path, no_judge):
    instructions = sample_instructions(3)
    run = make_run(tmp_path / "run", "m-async", dict.fromkeys(instructions, "x"))
    base = make_run(tmp_path / "base", "base-sequential", dict.fromkeys(instructions[:1], "y"), "sequential")
    cfg = compose("eval", ["eval.mode=score", "eval.limit=3", f"output_dir={run}", f"eval.reference={base}"])
    with pytest.raises(PastaError, match=r"reference .*base lacks 2 of the 3"):
        evaluate(cfg)


def test_sequential_run_that_is_not_sequential_is_rejected(tmp_path):
    instructions = sample_instructions(2)
    run = make_run(tmp_path / "run", "m-async", dict.fromkeys(instructions, "x"))
    other = make_run(tmp_path / "other", "other-async", dict.fromkeys(instructions, "y"))
    with start_chat_server(tmp_path, rules=JUDGE_RULES) as (base_url, _):
        cfg = compose("eval", ["eval.mode=score", "eval.limit=2", f"output_dir={run}", f"eval.sequential={other}",
                               *openai_judge_overrides(base_url)])
        with pytest.raises(PastaError, match="decoded with decode=async, not sequential"):
            evaluate(cfg)


def test_any_alpaca_eval_outputs_file_is_scored_against_the_gpt4_turbo_references(shared_data_dir, tmp_path):
    outputs_file = shared_data_dir / "alpaca_eval_fixtures" / "alpaca-7b__model_outputs.json"
    with start_chat_server(tmp_path, rules=JUDGE_RULES) as (base_url, _):
        cfg = compose("eval", ["eval_data=alpaca_eval", "eval.mode=score", "eval.limit=3", f"eval.outputs={outputs_file}",
                               f"output_dir={tmp_path / 'alpaca-7b'}", *openai_judge_overrides(base_url)])
        quality = evaluate(cfg)["summary"]["quality"]
    # No answer says BEST, so the scripted judge's position bias cancels: every pair is a tie.
    assert (quality["win_rate"], quality["n_total"]) == (50.0, 3)
    assert (quality["generator"], quality["reference"]) == ("alpaca-7b", "gpt4_1106_preview")


# ------------------------------------------------------------------ official LC, with a stand-in df_gamed.csv


def fake_hub_file(cache_dir: Path, filename: str, frame: pd.DataFrame) -> None:
    """Put `filename` of the tatsu-lab/alpaca_eval dataset into a hub cache, as a download would have."""
    repo = cache_dir / "datasets--tatsu-lab--alpaca_eval"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    frame.to_csv(repo / "snapshots" / commit / filename, index=False)


def test_official_lc_looks_up_instruction_difficulty_by_alpaca_eval_position(shared_data_dir, tmp_path, monkeypatch):
    import alpaca_eval.constants
    import alpaca_eval.metrics
    import numpy as np

    # A stand-in for alpaca_eval's df_gamed.csv (not its numbers): two length-gamed baselines on all 805 prompts.
    rng = np.random.default_rng(0)
    gamed = pd.concat([
        pd.DataFrame({"model": name, "index": np.arange(805), "preference": rng.uniform(0, 1, 805),
                      "std_delta_len": rng.normal(sign, 0.5, 805), "instruction_difficulty": rng.normal(0, 1, 805),
                      "not_gamed_baseline": False})
        for name, sign in (("verbose", -1.0), ("concise", 1.0))
    ])
    fake_hub_file(tmp_path / "hub", "df_gamed.csv", gamed)
    monkeypatch.setattr(alpaca_eval.constants, "DEFAULT_CACHE_DIR", str(tmp_path / "hub"))
    # alpaca_eval reads a row's instruction difficulty at the frame's index: record what it is given.
    given = []
    real_lc = alpaca_eval.metrics.get_length_controlled_winrate

    def spy(frame, **kwargs):
        given.append(frame.copy())
        return real_lc(frame, **kwargs)

    monkeypatch.setattr(alpaca_eval.metrics, "get_length_controlled_winrate", spy)

    annotations = json.loads((shared_data_dir / FIXTURE_ANNOTATIONS).read_text())
    positions = {a["instruction"]: index for index, a in enumerate(annotations)}  # the fixture is in AlpacaEval order
    subset = tmp_path / "subset.json"  # 300 prompts from the end of the set, shuffled
    subset.write_text(json.dumps([annotations[i] for i in np.random.default_rng(1).permutation(range(505, 805))]))
    results = []
    for path in (shared_data_dir / FIXTURE_ANNOTATIONS, subset):
        cfg = compose("eval", ["eval_data=alpaca_eval", f"eval.annotations={path}", f"output_dir={tmp_path / path.stem}"])
        results.append(evaluate(cfg)["summary"]["quality"])
    for frame in given:
        assert list(frame.index) == [positions[instruction] for instruction in frame["instruction"]]
    assert len(given) == 2 and len(given[1]) == 300
    assert results[0]["lc_method"] == "alpaca_eval length_controlled_v1"
    assert 0 < results[0]["length_controlled_winrate"] < 100
    assert (results[0]["comparable_with_leaderboard"], results[1]["comparable_with_leaderboard"]) == (True, False)


@pytest.mark.parametrize("num_pairs", [1, 9])
def test_too_few_judged_pairs_give_no_official_lc_and_say_why(num_pairs):
    """alpaca_eval's length GLM on one pair fails inside alpaca_eval after judging; below the offline estimate's
    floor the official one is not fitted either."""
    rows = [{"instruction": f"q{i}", "output_1": "a" * (i + 1), "output_2": "b" * (2 * i + 3), "preference": 2.0,
             "generator_1": "ref", "generator_2": "m"} for i in range(num_pairs)]
    positions = {f"q{i}": i for i in range(805)}
    result = make_metric_fn(positions, "auto")(rows)
    assert result["win_rate"] == 100.0 and "length_controlled_winrate" not in result
    assert f"{num_pairs} judged pairs: too few to fit the length GLM" in result["lc_unavailable"]
    with pytest.raises(PastaError, match="length_controlled=official, but .* too few"):
        make_metric_fn(positions, "official")(rows)


def test_annotations_of_one_model_are_not_scored_into_another_models_run(tmp_path):
    """The summary would join their win rate to the folder's speed and structure, another model's."""
    instructions = sample_instructions(2)
    run = make_run(tmp_path / "run", "model-b", dict.fromkeys(instructions, "b"))
    annotations = tmp_path / "annotations.json"
    annotations.write_text(json.dumps([
        {"instruction": q, "output_1": "ref", "output_2": "a", "generator_1": "ref", "generator_2": "model-a",
         "preference": 2.0} for q in instructions]))
    cfg = compose("eval", [f"eval.annotations={annotations}", f"output_dir={run}"])
    with pytest.raises(PastaError, match="eval.annotations judge 'model-a', but .* holds a run of 'model-b'"):
        evaluate(cfg)
    assert not (run / "summary.json").exists()
