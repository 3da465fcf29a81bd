"""Generation on the tiny random model: AlpacaEval-format outputs, per-prompt stats, resume after a kill, SoT, and
the whole generate -> score path."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import start_chat_server
from pasta.config import compose, schema_from
from pasta.decoding import DecodeConfig, DecodeResult, DecodeStats
from pasta.errors import PastaError
from pasta.eval import evaluate
from pasta.evaluation import generation, sot
from pasta.evaluation.config import EvalConfig
from pasta.evaluation.run_files import load_model_outputs, machine, same_machine
from test_eval_quality import JUDGE_RULES, openai_judge_overrides

TINY = ["model=tiny", "decode.max_new_tokens=8", "eval.warmup_prompts=1", "device=cpu"]
STATS_FIELDS = {"instruction", "output", "annotated", "num_tokens", "num_steps", "theoretical_speedup", "wall_s",
                "prefill_s", "decode_s", "finish_reason", "batch_size"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def generate(tmp_path, decode: str, *overrides: str, name: str = "run") -> dict:
    cfg = compose("eval", [*TINY, f"decode={decode}", "eval.mode=generate", f"output_dir={tmp_path / name}",
                           *overrides])
    return evaluate(cfg)


def count_decoded(monkeypatch) -> list[str]:
    decoded: list[str] = []
    original = generation.Decoder.__call__

    def counting(self, records, **kwargs):
        decoded.extend(r["instruction"] for r in records)
        return original(self, records, **kwargs)

    monkeypatch.setattr(generation.Decoder, "__call__", counting)
    return decoded


@pytest.mark.parametrize("decode", ["sequential", "async"])
def test_generation_writes_alpaca_eval_outputs_and_per_prompt_stats(tmp_path, decode):
    import alpaca_eval.utils

    generate(tmp_path, decode, "eval.limit=3")
    run = tmp_path / "run"
    outputs = load_model_outputs(run, expected_generator=f"tiny-{decode}")
    frame = alpaca_eval.utils.load_or_convert_to_dataframe(run / "model_outputs.json")
    assert list(frame["instruction"]) == [o["instruction"] for o in outputs] and len(outputs) == 3
    assert set(frame.columns) >= {"instruction", "output", "generator", "dataset"}
    stats = [json.loads(line) for line in (run / "stats.jsonl").read_text().splitlines()]
    assert len(stats) == 3 and all(set(record) >= STATS_FIELDS for record in stats)
    for record, output in zip(stats, outputs, strict=True):
        assert record["output"] == output["output"]
        assert record["theoretical_speedup"] == pytest.approx(record["num_tokens"] / record["num_steps"])
        assert record["wall_s"] > 0 and record["batch_size"] == 1
    meta = json.loads((run / "run.json").read_text())
    assert (meta["decode"], meta["timing"], meta["model"]) == (decode, "wall", "tiny")
    assert meta["device"].startswith("cpu: ")
    assert meta["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # AVX512, AVX2, ...


def test_killed_generation_resumes_without_decoding_finished_prompts_again(tmp_path, monkeypatch):
    generate(tmp_path, "sequential", "eval.limit=3", "eval.warmup_prompts=0")
    run = tmp_path / "run"
    lines = (run / "stats.jsonl").read_text().splitlines(keepends=True)
    # A kill during the third prompt: two whole lines, half of the third, and no model_outputs.json yet.
    (run / "stats.jsonl").write_text(lines[0] + lines[1] + lines[2][:20])
    (run / "model_outputs.json").unlink()
    decoded = count_decoded(monkeypatch)
    generate(tmp_path, "sequential", "eval.limit=3", "eval.warmup_prompts=0")
    third = json.loads(lines[2])["instruction"]
    assert decoded == [third]
    assert [json.loads(line)["instruction"] for line in (run / "stats.jsonl").read_text().splitlines()] == [
        json.loads(line)["instruction"] for line in lines
    ]
    assert len(load_model_outputs(run)) == 3


def test_finished_run_is_not_decoded_again(tmp_path, monkeypatch):
    generate(tmp_path, "sequential", "eval.limit=2")
    decoded = count_decoded(monkeypatch)
    generate(tmp_path, "sequential", "eval.limit=2")
    assert decoded == []


def test_a_rerun_measures_a_cost_model_of_an_older_version_again_without_decoding(tmp_path, monkeypatch):
    generate(tmp_path, "sequential", "eval.limit=2")
    costs_path = tmp_path / "run" / "step_costs.json"
    costs_path.write_text(json.dumps({"rows": [1, 2], "seconds": [0.1, 0.2], "prefix_len": 256}))  # version 1
    decoded = count_decoded(monkeypatch)
    generate(tmp_path, "sequential", "eval.limit=2")
    costs = json.loads(costs_path.read_text())
    assert decoded == [] and costs["version"] == 2
    assert costs["rows"][:2] == [1, 2] and len(costs["seconds"]) == len(costs["rows"])
    assert all(seconds > 0 for seconds in costs["seconds"])
    assert costs["seconds"] == sorted(costs["seconds"])  # a forward feeding fewer rows is never priced higher


def test_a_prompt_whose_decode_fails_stops_the_run_naming_it_and_the_batchs_other_answers_are_kept(
        tmp_path, monkeypatch):
    from pasta.decoding.plain import PlainInterpreter

    commit = PlainInterpreter.commit
    failing = {"on": True, "prompt_ids": None}

    def fragile_commit(self, plan, token_ids):
        if failing["on"] and self.prompt_ids == failing["prompt_ids"] and len(self.main_ids) == 3:
            raise RuntimeError("injected failure")
        commit(self, plan, token_ids)

    original = generation.Decoder.__call__

    def decode(self, records, **kwargs):  # the last prompt of each call fails
        from pasta.models import encode_prompt

        failing["prompt_ids"] = encode_prompt(self.tokenizer, records[-1]["instruction"])
        return original(self, records, **kwargs)

    monkeypatch.setattr(PlainInterpreter, "commit", fragile_commit)
    monkeypatch.setattr(generation.Decoder, "__call__", decode)
    with pytest.raises(PastaError, match=r"^decoding the prompt '.*' failed: sampling or committing the step "
                                         r"failed: injected failure$"):
        generate(tmp_path, "sequential", "eval.limit=2", "eval.timing=throughput", "eval.batch_size=2")
    kept = [json.loads(line) for line in (tmp_path / "run" / "stats.jsonl").read_text().splitlines()]
    assert len(kept) == 1 and kept[0]["batch_size"] == 2  # the first prompt, decoded beside the failing one
    failing["on"] = False
    decoded = count_decoded(monkeypatch)
    generate(tmp_path, "sequential", "eval.limit=2", "eval.timing=throughput", "eval.batch_size=2")
    assert len(decoded) == 1 and decoded[0] != kept[0]["instruction"]  # only the failed one again


def test_rerun_into_a_directory_of_another_decode_mode_is_refused(tmp_path):
    generate(tmp_path, "sequential", "eval.limit=1", "eval.generator=same-name")
    with pytest.raises(PastaError, match="holds a run with decode='sequential', not 'async'"):
        generate(tmp_path, "async", "eval.limit=1", "eval.generator=same-name")


def test_an_async_run_resumes_only_with_the_parallelism_replays_it_was_decoded_with(tmp_path):
    """Forked answers decoded without their replay would leave the parallelism geomean, the plain ones not."""
    generate(tmp_path, "async", "eval.limit=1", "eval.parallelism=false")
    with pytest.raises(PastaError, match="holds a run with parallelism=False, not True"):
        generate(tmp_path, "async", "eval.limit=2", "eval.parallelism=true")


@pytest.mark.parametrize(("key", "other"), [("device", "cpu: another machine, 64 threads"),
                                           ("cpu_capability", "ANOTHER_ISA")])
def test_resuming_on_another_machine_is_refused(tmp_path, key, other):
    """Another CPU, or the same CPU name with other vector instructions (two hosts /proc/cpuinfo names alike)."""
    generate(tmp_path, "sequential", "eval.limit=1", "num_threads=1")
    meta_path = tmp_path / "run" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, key: other}))
    with pytest.raises(PastaError, match=f"holds a run with {key}='{other}'"):
        generate(tmp_path, "sequential", "eval.limit=1", "num_threads=1")


def test_wall_times_compare_on_one_device_and_instruction_set_and_an_older_record_matches_either():
    avx512 = {"device": "cpu: AMD EPYC, 2 threads", "cpu_capability": "AVX512"}
    avx2 = {**avx512, "cpu_capability": "AVX2"}
    older = {"device": "cpu: AMD EPYC, 2 threads"}  # a run.json from before the instruction set was recorded
    assert same_machine(avx512, dict(avx512)) and not same_machine(avx512, avx2)
    assert same_machine(older, avx2) and same_machine(avx512, older)
    assert not same_machine(avx2, {**avx2, "device": "cpu: AMD EPYC, 4 threads"})
    assert (machine(avx2), machine(older)) == ("cpu: AMD EPYC, 2 threads, AVX2", "cpu: AMD EPYC, 2 threads")


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(PastaError, match="model.path=.*no-such-checkpoint"):
        generate(tmp_path, "async", "eval.limit=1", f"model.path={tmp_path / 'no-such-checkpoint'}")


def test_unknown_decode_mode_is_refused_naming_the_options(tmp_path):
    with pytest.raises(PastaError, match=r"^decode: no option 'beam' \(choose from async, sequential, sot\)$"):
        generate(tmp_path, "beam", "eval.limit=1")


@pytest.mark.parametrize("decode", ["sequential", "async", "sot"])
def test_prompts_over_the_models_context_are_refused_with_a_count_before_the_weights_load(tmp_path, monkeypatch,
                                                                                           decode):
    """The tiny model has 4096 positions; "word " * 5000 is 5000 tokens. Without the check such a prompt reaches
    the decoder, whose cache for a 30-million-character one would ask for terabytes."""
    path = tmp_path / "long.jsonl"
    prompts = ["Name a fruit.", "word " * 5000, "Name a colour.", "word " * 4090]
    path.write_text("".join(json.dumps({"instruction": p, "output": "x"}) + "\n" for p in prompts))

    def load_model(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr("pasta.models.load_model", load_model)
    with pytest.raises(PastaError, match=r"^eval_data sample: 2 of 4 prompts do not fit the model's 4096 positions "
                                         r"with decode.max_new_tokens=8 \(the first: prompt 2, 50\d\d tokens\)"):
        generate(tmp_path, decode, f"eval_data.path={path}")
    assert not (tmp_path / "run" / "stats.jsonl").exists()


def test_throughput_mode_decodes_batch_size_prompts_at_once_and_records_it(tmp_path, monkeypatch):
    calls = []
    original = generation.Decoder.__call__
    monkeypatch.setattr(generation.Decoder, "__call__", lambda self, records, **kwargs: calls.append(
        (len(records), kwargs.get("max_batch"))) or original(self, records, **kwargs))
    generate(tmp_path, "sequential", "eval.limit=3", "eval.timing=throughput", "eval.batch_size=2")
    stats = [json.loads(line) for line in (tmp_path / "run" / "stats.jsonl").read_text().splitlines()]
    assert calls == [(3, 2)]  # one continuously batched call: the third prompt joins as one of the first two ends
    assert [record["batch_size"] for record in stats] == [2, 2, 2]


def test_timed_prompts_are_decoded_alone_first_and_every_answer_keeps_its_step_rows(tmp_path, monkeypatch):
    decoded = []
    original = generation.Decoder.__call__
    monkeypatch.setattr(generation.Decoder, "__call__",
                        lambda self, records, **kwargs: decoded.append(len(records)) or original(self, records,
                                                                                                   **kwargs))
    generate(tmp_path, "async", "eval.limit=5", "eval.timing=throughput", "eval.batch_size=2",
             "eval.timed_prompts=2", "eval.warmup_prompts=1")
    stats = [json.loads(line) for line in (tmp_path / "run" / "stats.jsonl").read_text().splitlines()]
    assert [record["batch_size"] for record in stats] == [1, 1, 2, 2, 2]
    assert decoded == [1, 1, 1, 3]  # the warm-up, the two timed prompts, then the rest, two at a time
    for record in stats:
        assert len(record["step_rows"]) == record["num_steps"] and record["step_rows"][0] > 1  # the prompt first
    # Only a sequential run measures the cost model: eval.sequential prices both sides on the sequential run's.
    assert not (tmp_path / "run" / "step_costs.json").exists()


def test_forked_answers_timed_alone_are_replayed_as_their_plain_text_and_timed(tmp_path, monkeypatch):
    import dataclasses

    from pasta.lang import encode_text
    from pasta.models import load_model

    # The tiny random model forks nothing: say the first timed answer forked, so that it is replayed for real.
    original = generation.Decoder.__call__
    calls = []

    def first_forks(self, records, **kwargs):
        results = original(self, records, **kwargs)
        calls.append(len(records))
        if len(calls) == 2:  # after the warm-up
            results[0] = dataclasses.replace(results[0], stats=dataclasses.replace(results[0].stats, num_threads=1))
        return results

    monkeypatch.setattr(generation.Decoder, "__call__", first_forks)
    generate(tmp_path, "async", "eval.limit=3", "eval.timing=throughput", "eval.batch_size=2",
             "eval.timed_prompts=2")
    forked, unforked, batched = [json.loads(line) for line in (tmp_path / "run" / "stats.jsonl").read_text().splitlines()]
    _, tokenizer = load_model(compose("eval", TINY).model, device="cpu")
    eos = forked["finish_reason"] == "eos"
    assert forked["replay_num_tokens"] == len(encode_text(tokenizer, forked["output"])) + eos
    assert forked["replay_wall_s"] > 0
    assert "replay_wall_s" not in unforked  # it was its own plain decode
    assert "replay_wall_s" not in batched  # a batch's wall time is not one answer's
    monkeypatch.setattr(generation.Decoder, "__call__", original)
    calls.clear()
    generate(tmp_path, "async", "eval.limit=1", "eval.parallelism=false", name="off")
    (record,) = [json.loads(line) for line in (tmp_path / "off" / "stats.jsonl").read_text().splitlines()]
    assert "replay_wall_s" not in record


def test_a_sequential_model_is_timed_beside_each_prompt_decoded_alone(tmp_path, tiny_model_and_tokenizer):
    """eval.sequential_model decodes every timed prompt right after the run's answer, in the same run: its time and
    length sit on the answer's stats line; batched answers have none; the setting is part of what a resume keeps."""
    model, tokenizer = tiny_model_and_tokenizer
    model.save_pretrained(tmp_path / "baseline")
    tokenizer.save_pretrained(tmp_path / "baseline")
    beside = ("eval.limit=4", "eval.timing=throughput", "eval.batch_size=2", "eval.timed_prompts=2",
              f"eval.sequential_model={tmp_path / 'baseline'}")
    generate(tmp_path, "sequential", "eval.limit=4", "eval.timing=throughput", "eval.batch_size=2",
             "eval.timed_prompts=2", name="baseline-run")
    generate(tmp_path, "async", *beside)
    timed_1, timed_2, *batched = [json.loads(line) for line in (tmp_path / "run" / "stats.jsonl").read_text().splitlines()]
    baseline = [json.loads(line) for line in (tmp_path / "baseline-run" / "stats.jsonl").read_text().splitlines()]
    for record, sequential in zip((timed_1, timed_2), baseline, strict=False):
        assert record["sequential_wall_s"] > 0
        assert record["sequential_num_tokens"] == sequential["num_tokens"]  # the same model, the same answer
    assert [record["batch_size"] for record in batched] == [2, 2]
    assert not any("sequential_wall_s" in record for record in batched)
    with pytest.raises(PastaError, match=r"sequential_model=.*baseline', not None"):
        generate(tmp_path, "async", "eval.limit=4", "eval.timing=throughput", "eval.batch_size=2",
                 "eval.timed_prompts=2")
    with pytest.raises(PastaError, match=r"^eval.sequential_model=.*nowhere"):
        generate(tmp_path, "async", *beside[:-1], f"eval.sequential_model={tmp_path / 'nowhere'}", name="other")


# ------------------------------------------------------------------------------------------ Skeleton-of-Thought


def test_outline_points_are_read_from_numbered_lines():
    text = "1. Research the company\n2) Practise answers:\nSome chatter\n 3.  Arrive early \n4. Ask questions"
    assert sot.parse_outline(text, max_points=3) == ["Research the company", "Practise answers", "Arrive early"]
    assert sot.parse_outline("no list at all", max_points=5) == []


def sot_config() -> EvalConfig:
    return schema_from(compose("eval").eval, EvalConfig, "eval")


def fake_result(text: str, tokens: int, steps: int | None = None, finish_reason: str = "eos") -> DecodeResult:
    stats = DecodeStats(num_tokens=tokens, num_steps=steps or tokens, prefill_s=0.01, wall_s=0.02,
                        finish_reason=finish_reason)
    return DecodeResult(text=text, annotated=text, token_doc=None, token_ids=[0] * tokens, stats=stats)


def test_sot_expands_every_point_in_one_batch_and_counts_the_critical_path(monkeypatch):
    calls = []

    def fake_decode(model, tokenizer, prompt_ids_batch, config):
        calls.append((len(prompt_ids_batch), config.max_new_tokens))
        if len(calls) == 1:
            return [fake_result(" Prepare\n2. Practise\n3. Follow up", tokens=12)]
        # The second point runs on into a third: SoT keeps its own point only.
        return [fake_result(" well ahead.", 5), fake_result(" out loud.\n3. Follow up soon", 9, finish_reason="max_new_tokens"),
                fake_result("!", 2)]

    monkeypatch.setattr(sot, "decode_sequential", fake_decode)
    _, tokenizer = _tiny()
    config = sot_config()
    result = sot.decode_sot(None, tokenizer, "Tips for an interview?", config.sot, DecodeConfig(max_new_tokens=64))
    assert calls == [(1, config.sot.outline_max_new_tokens), (3, config.sot.point_max_new_tokens)]
    assert result.text == "1. Prepare well ahead.\n2. Practise out loud.\n3. Follow up!"
    assert result.annotated == "1. Prepare\n2. Practise\n3. Follow up"
    stats = result.stats
    assert (stats.num_tokens, stats.num_steps, stats.num_threads) == (12 + 5 + 9 + 2, 12 + 9, 3)
    assert stats.theoretical_speedup == pytest.approx(28 / 21)
    # One finish reason, as every decode records: a point its budget cut cuts the answer (a budget cut counted).
    assert stats.finish_reason == "max_new_tokens"


def test_sot_skeleton_without_points_is_kept_as_the_answer(monkeypatch):
    calls = []

    def fake_decode(*args, **kwargs):
        calls.append(args)
        return [fake_result("\nSure! Be yourself and smile.", 8)]

    monkeypatch.setattr(sot, "decode_sequential", fake_decode)
    _, tokenizer = _tiny()
    result = sot.decode_sot(None, tokenizer, "Hi?", sot_config().sot, DecodeConfig())
    assert len(calls) == 1  # no point, nothing to expand
    assert result.text == "Sure! Be yourself and smile."
    assert result.stats.malformed == {"sot_no_points": 1}
    assert (result.stats.num_tokens, result.stats.num_steps) == (8, 8)


def _tiny():
    from pasta.models import load_model

    return load_model(compose("eval", ["model=tiny"]).model, device="cpu")


def test_sot_decodes_on_the_tiny_model(tmp_path):
    generate(tmp_path, "sot", "eval.limit=2", "eval.sot.outline_max_new_tokens=12", "eval.sot.point_max_new_tokens=6",
             "eval.warmup_prompts=0")
    run = tmp_path / "run"
    outputs = load_model_outputs(run, expected_generator="tiny-sot")
    stats = [json.loads(line) for line in (run / "stats.jsonl").read_text().splitlines()]
    for record, output in zip(stats, outputs, strict=True):
        points = sot.parse_outline(record["annotated"], max_points=6)
        assert record["num_threads"] == len(points)
        assert output["output"].startswith("1.")
        # Every point's tokens count, but only the longest point's steps: never more steps than tokens.
        assert record["num_steps"] <= record["num_tokens"]


# ------------------------------------------------------------------------------------------- the whole path


def test_generate_then_score_gives_a_summary_with_quality_and_wall_speedup(tmp_path):
    generate(tmp_path, "sequential", "eval.limit=2", name="base")
    base = tmp_path / "base"
    with start_chat_server(tmp_path, rules=JUDGE_RULES) as (base_url, _):
        cfg = compose("eval", [*TINY, "decode=async", "eval.limit=2", f"output_dir={tmp_path / 'pasta'}",
                               f"eval.reference={base}", f"eval.sequential={base}", "eval.bootstrap.num_resamples=100",
                               *openai_judge_overrides(base_url)])
        result = evaluate(cfg)
    assert result["mode"] == "all"
    summary = result["summary"]
    assert summary["quality"]["reference"] == "tiny-sequential" and summary["quality"]["n_total"] == 2
    assert 0 <= summary["quality"]["win_rate"] <= 100
    assert summary["speed"]["wall_speedup_geomean"]["value"] > 0
    assert (tmp_path / "pasta" / "summary.md").read_text().startswith("# Evaluation: tiny-async")
