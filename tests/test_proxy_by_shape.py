"""scripts/proxy_by_shape.py: each answer's emb-sim minus Baseline-SFT's on the same prompt, split by answer shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.scripts import load_script
from pasta.data import read_jsonl

SAMPLE = [r["instruction"] for r in read_jsonl(Path(__file__).resolve().parents[1] / "data" / "eval_sample.jsonl")][:4]


class LengthJudge:
    """Longer answers score higher: a deterministic stand-in for the embedding judge."""

    name = "fake:length"

    def score(self, items):
        return [len(item.candidate) / 100 for item in items]


def write_run(folder, answers: list[tuple[str, str, str]]) -> str:
    folder.mkdir()
    lines = [{"instruction": i, "output": o, "annotated": a, "num_tokens": 1, "num_steps": 1,
              "theoretical_speedup": 1.0, "wall_s": 0.0} for i, o, a in answers]
    (folder / "stats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(folder)


def test_an_answers_shape_is_where_its_first_promise_sits():
    shape = load_script("proxy_by_shape").answer_shape
    fork = '<promise topic="a"/>\n2.<promise topic="b"/><async topic="a"> x</async><async topic="b"> y</async><sync/>'
    assert shape("Plain text, no promise.") == "plain"
    assert shape(fork) == "opens with promises"
    assert shape("1." + fork) == "opens with promises"  # a list with no sentence before it
    assert shape("Two tips:\n1." + fork) == "lead, then promises"
    assert shape('a <promise topic="a"/>') == "plain"  # does not parse: decoded as text


def test_the_shapes_parts_add_up_to_the_runs_difference_with_baseline_sft(tmp_path, monkeypatch, capsys):
    script = load_script("proxy_by_shape")
    monkeypatch.setattr("pasta.evaluation.proxies.embedding_judge", LengthJudge)
    baseline = write_run(tmp_path / "baseline-sft", [(i, "x" * 50, "x" * 50) for i in SAMPLE])
    fork = '1.<promise topic="a"/><async topic="a"> {}</async><sync/>'
    run = write_run(tmp_path / "pasta", [
        (SAMPLE[0], "1. " + "y" * 10, fork.format("y" * 10)),  # opens with promises: 0.13 - 0.5
        (SAMPLE[1], "Tips:\n1. " + "y" * 60, "Tips:\n" + fork.format("y" * 60)),  # a lead: 0.69 - 0.5
        (SAMPLE[2], "z" * 70, "z" * 70),  # plain: 0.7 - 0.5
    ])  # SAMPLE[3] unanswered: compared on the three prompts both runs answered
    assert script.main([baseline, run, "--eval-data", "sample"]) == 0
    out = capsys.readouterr().out
    assert "emb-sim: fake:length, an offline proxy; references: eval_data=sample" in out
    assert "pasta: emb-sim (proxy) 0.5067 against Baseline-SFT's 0.5000 on the same 3 prompts (difference +0.0067)" in out
    assert "| plain | 1 | +0.2000 | +0.0667 |" in out
    assert "| opens with promises | 1 | -0.3700 | -0.1233 |" in out
    assert "| lead, then promises | 1 | +0.1900 | +0.0633 |" in out  # the parts: +0.0667 - 0.1233 + 0.0633 = +0.0067


@pytest.mark.parametrize(("which", "says"), [("baseline", "per-prompt stats not found"),
                                             ("eval_data", "does not hold")])
def test_a_missing_run_or_another_eval_sets_answers_is_one_line_and_exit_2(tmp_path, capsys, which, says):
    script = load_script("proxy_by_shape")
    if which == "baseline":
        args = [str(tmp_path / "nowhere"), str(tmp_path / "nowhere")]
    else:
        run = write_run(tmp_path / "other", [("A prompt of no eval set", "x", "x")])
        args = [run, run, "--eval-data", "sample"]
    assert script.main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and says in line
