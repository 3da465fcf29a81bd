"""The held-out protocol: a seeded eval.subset that every model and decode mode is decoded on, recorded in run.json,
and the structure and proxy tables of scored runs in the gathered report."""

from __future__ import annotations

import json

import pytest

from helpers import start_chat_server
from pasta.config import compose
from pasta.errors import PastaError
from pasta.eval import evaluate
from pasta.evaluation.eval_set import eval_prompts, select_subset
from test_eval_quality import JUDGE_RULES, openai_judge_overrides

TINY = ["model=tiny", "decode.max_new_tokens=8", "eval.warmup_prompts=0", "device=cpu"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def instructions_of(overrides: list[str]) -> list[str]:
    cfg = compose("eval", overrides)
    records, _, _ = eval_prompts(cfg, cfg.eval.limit, cfg.eval.subset, cfg.eval.subset_seed)
    return [record["instruction"] for record in records]


def test_subset_is_the_same_prompts_for_every_model_and_decode_mode(shared_data_dir):
    subset = ["eval_data=alpaca_eval", "eval.subset=100", "eval.subset_seed=0"]
    chosen = instructions_of([*subset, "model=tiny", "decode=async"])
    assert len(chosen) == len(set(chosen)) == 100
    for other in (["model=tiny", "decode=sequential"], ["decode=sot"], ["model.path=/some/checkpoint", "decode=async"]):
        assert instructions_of([*subset, *other]) == chosen
    everything = instructions_of(["eval_data=alpaca_eval"])
    assert chosen == [instruction for instruction in everything if instruction in set(chosen)]  # data-set order
    assert instructions_of(["eval_data=alpaca_eval", "eval.subset=100", "eval.subset_seed=1"]) != chosen


def test_subset_is_deterministic_nested_and_limit_takes_its_first_prompts():
    records = [{"instruction": f"prompt {n}"} for n in range(50)]
    ten = select_subset(records, 10, seed=3)
    assert ten == select_subset(list(reversed(records)), 10, seed=3)[::-1]  # whatever order the data comes in
    assert all(record in select_subset(records, 20, seed=3) for record in ten)
    sample = instructions_of(["eval.subset=10", "eval.subset_seed=3"])
    assert instructions_of(["eval.subset=10", "eval.subset_seed=3", "eval.limit=4"]) == sample[:4]
    with pytest.raises(PastaError, match="eval.subset=60 but eval_data selects only 50 prompts"):
        select_subset(records, 60, seed=0)


def generate(tmp_path, name: str, decode: str, *overrides: str) -> dict:
    cfg = compose("eval", [*TINY, f"decode={decode}", "eval.mode=generate", f"output_dir={tmp_path / name}",
                           *overrides])
    return evaluate(cfg)


def stats_instructions(run_dir) -> list[str]:
    return [json.loads(line)["instruction"] for line in (run_dir / "stats.jsonl").read_text().splitlines()]


def test_subset_runs_decode_the_same_prompts_record_them_and_refuse_another_subset(tmp_path):
    subset = ["eval.subset=3", "eval.subset_seed=7"]
    generate(tmp_path, "base", "sequential", *subset)
    generate(tmp_path, "pasta", "async", *subset)
    assert stats_instructions(tmp_path / "base") == stats_instructions(tmp_path / "pasta") == instructions_of(subset)
    meta = json.loads((tmp_path / "pasta" / "run.json").read_text())
    assert meta["subset"] == {"size": 3, "seed": 7} and meta["reservation"]["policy"] == "uncounted"
    assert meta["num_outside_heldout_pool"] is None  # not the full AlpacaEval set: no pool to be outside of
    with pytest.raises(PastaError, match=r"holds a run with subset\.seed=7, not 8: "):
        generate(tmp_path, "pasta", "async", "eval.subset=3", "eval.subset_seed=8")
    cfg = compose("eval", [*TINY, "eval.mode=score", f"output_dir={tmp_path / 'pasta'}"])
    with pytest.raises(PastaError, match="decoded on eval.subset=3 eval.subset_seed=7, not every prompt"):
        evaluate(cfg)


def test_prompts_outside_the_held_out_pool_are_counted_when_the_data_holds_the_pool(monkeypatch):
    from pasta.data import heldout
    from pasta.evaluation import eval_set

    monkeypatch.setattr(heldout, "heldout_pool", lambda: frozenset({heldout.prompt_hash("Held out?")}))
    monkeypatch.setattr(eval_set, "HELDOUT_POOL_SIZE", 1)
    records = [{"instruction": "Held out?"}, {"instruction": "Trained on?"}, {"instruction": "Also trained on?"}]
    everything = ["  held out?\r\n"] + [r["instruction"] for r in records[1:]]  # a reformatted copy holds the pool
    assert eval_set.num_outside_heldout_pool(records, everything) == 2
    assert eval_set.num_outside_heldout_pool(records[:1], everything) == 0
    assert eval_set.num_outside_heldout_pool(records[1:], everything[1:]) is None  # no pool to be outside of


def test_a_run_recorded_before_the_reservation_policy_resumes_but_not_under_another_policy(tmp_path):
    generate(tmp_path, "pasta", "async", "eval.limit=1")
    meta_path = tmp_path / "pasta" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({key: value for key, value in meta.items() if key != "reservation"}))
    generate(tmp_path, "pasta", "async", "eval.limit=2")
    assert len(stats_instructions(tmp_path / "pasta")) == 2
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(PastaError, match=r"holds a run with reservation\.policy='uncounted', not 'exact': "):
        generate(tmp_path, "pasta", "async", "eval.limit=2", "lang.reservation.policy=exact")


def test_a_run_recorded_before_a_decode_setting_existed_resumes_but_not_under_another_value_of_it(tmp_path):
    """run.json of a run decoded before `decode.sampling.no_repeat_ngram_size` existed lacks it: that run decoded as
    its default (off) does, so it resumes with the default and is refused with the guard on."""
    generate(tmp_path, "pasta", "async", "eval.limit=1")
    meta_path = tmp_path / "pasta" / "run.json"
    meta = json.loads(meta_path.read_text())
    del meta["decoding"]["sampling"]["no_repeat_ngram_size"]
    meta_path.write_text(json.dumps(meta))
    generate(tmp_path, "pasta", "async", "eval.limit=2")
    assert len(stats_instructions(tmp_path / "pasta")) == 2
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(PastaError, match=r"holds a run with decode\.sampling\.no_repeat_ngram_size=0, not 3: "):
        generate(tmp_path, "pasta", "async", "eval.limit=3", "decode.sampling.no_repeat_ngram_size=3")


def test_scored_subset_runs_report_structure_and_proxies_labelled_as_proxies(tmp_path, embedding_judge):
    subset = ["eval.subset=2", "eval.subset_seed=0"]
    generate(tmp_path, "base", "sequential", *subset)
    base = tmp_path / "base"
    with start_chat_server(tmp_path, rules=JUDGE_RULES) as (base_url, _):
        cfg = compose("eval", [*TINY, *subset, "decode=async", f"output_dir={tmp_path / 'pasta'}",
                               f"eval.reference={base}", f"eval.sequential={base}", "eval.bootstrap.num_resamples=50",
                               *openai_judge_overrides(base_url)])
        summary = evaluate(cfg)["summary"]
    assert summary["subset"] == {"size": 2, "seed": 0}
    structure, proxies = summary["structure"], summary["proxies"]
    assert structure["num_answers"] == proxies["num_answers"] == 2
    assert structure["reservation"]["policy"] == "uncounted"
    assert proxies["baseline"] == "tiny-sequential" and proxies["length_ratio"] > 0
    assert 0 <= proxies["embedding_similarity"] <= 1 and proxies["embedding_model"] == embedding_judge.name
    assert "emb-sim (proxy)" in (tmp_path / "pasta" / "summary.md").read_text()

    report = evaluate(compose("eval", [f"report=[{tmp_path / 'pasta'}]", f"output_dir={tmp_path / 'report'}"]))
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "## Structure" in markdown and "| tiny-async | async | 2 |" in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| run | answers | emb-sim"))
    assert header.count("(proxy)") == 4
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["structure"][0]["name"] == saved["proxies"][0]["name"] == "tiny-async"
    assert report["report"]["proxies"][0]["baseline"] == "tiny-sequential"
