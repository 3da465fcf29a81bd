"""Data-parallel decoding (pasta.parallel): shards, the part files' gathering, and `accelerate launch -m pasta.eval`
on 2 CPU processes (gloo) against one process, resumed across process counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import accelerate_launch
from pasta.config import compose
from pasta.data import JsonlAppender, read_jsonl
from pasta.errors import PastaError
from pasta.eval import evaluate
from pasta.evaluation.run_files import RUN_META
from pasta.parallel import Processes, ShardedJsonl, part_path

EVAL = ["model=tiny", "decode=async", "decode.max_new_tokens=8", "eval.mode=generate", "eval.warmup_prompts=0",
        "device=cpu", "num_threads=1", "eval.generator=tiny-async"]


def test_shards_cover_every_item_once_and_differ_in_size_by_at_most_one():
    items = list(range(11))
    shards = [Processes(index, 3).shard(items) for index in range(3)]
    assert sorted(sum(shards, [])) == items
    assert {len(shard) for shard in shards} == {3, 4}


def test_gather_folds_every_part_into_the_file_in_the_jobs_order(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text(json.dumps({"id": "b", "v": 1}) + "\n")
    part_path(path, 0).write_text(json.dumps({"id": "c", "v": 1}) + "\n")
    # A process killed mid-write: its whole lines count, the torn one is dropped.
    part_path(path, 1).write_text(json.dumps({"id": "a", "v": 1}) + "\n" + '{"id": "d", "v')
    ShardedJsonl(path, Processes(), key="id").gather(order=["a", "b", "c", "d"])
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b", "c"]
    assert not list(tmp_path.glob("*.part-*"))


def test_a_record_in_the_file_and_in_a_part_is_kept_once_the_part_winning(tmp_path):
    """A kill between replacing the file and deleting the parts leaves records twice; the next gather mends it."""
    path = tmp_path / "scores.jsonl"
    path.write_text(json.dumps({"id": "a", "v": 1}) + "\n")
    part_path(path, 3).write_text(json.dumps({"id": "a", "v": 2}) + "\n")
    ShardedJsonl(path, Processes(), key="id").gather()
    assert read_jsonl(path) == [{"id": "a", "v": 2}]


def test_each_process_appends_to_its_own_part_and_one_process_to_the_file(tmp_path):
    path = tmp_path / "stats.jsonl"
    with ShardedJsonl(path, Processes(1, 2), key="id").appender() as out:
        out.append({"id": "x"})
    with ShardedJsonl(path, Processes(), key="id").appender() as out:
        out.append({"id": "y"})
    assert read_jsonl(part_path(path, 1)) == [{"id": "x"}] and read_jsonl(path) == [{"id": "y"}]


def eval_run(tmp_path: Path, name: str, *overrides: str) -> Path:
    evaluate(compose("eval", [*EVAL, f"output_dir={tmp_path / name}", *overrides]))
    return tmp_path / name


def launched_eval_run(tmp_path: Path, name: str, *overrides: str) -> Path:
    done = accelerate_launch("pasta.eval", [*EVAL, f"output_dir={tmp_path / name}", *overrides])
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / name


def without_timings(run_dir: Path) -> list[dict]:
    """Per-prompt stats less what differs between two decodes of the same answers: the clock (`*_s`)."""
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in read_jsonl(run_dir / "stats.jsonl")]


def test_a_killed_launchs_part_files_count_as_done_when_one_process_resumes(tmp_path, monkeypatch):
    from pasta.evaluation import generation

    whole = eval_run(tmp_path, "whole", "eval.limit=3")
    stats = read_jsonl(whole / "stats.jsonl")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    meta = json.loads((whole / RUN_META).read_text())
    (resumed / RUN_META).write_text(json.dumps({**meta, "num_processes": 2}))
    # Process 1 of a killed 2-process launch had written the second prompt; process 0 nothing yet.
    part_path(resumed / "stats.jsonl", 1).write_text(json.dumps(stats[1]) + "\n")
    decoded: list[str] = []
    original = generation.Decoder.__call__
    monkeypatch.setattr(generation.Decoder, "__call__",
                        lambda self, records, **kwargs: decoded.extend(r["instruction"] for r in records)
                        or original(self, records, **kwargs))
    eval_run(tmp_path, "resumed", "eval.limit=3")
    assert decoded == [stats[0]["instruction"], stats[2]["instruction"]]
    assert without_timings(resumed) == without_timings(whole)
    assert json.loads((resumed / RUN_META).read_text())["num_processes"] == [1, 2]


def test_speedups_against_a_run_decoded_with_another_process_count_are_refused(tmp_path):
    sequential = eval_run(tmp_path, "seq", "eval.limit=2", "decode=sequential", "eval.generator=seq")
    run = eval_run(tmp_path, "async", "eval.limit=2")
    meta = json.loads((run / RUN_META).read_text())
    (run / RUN_META).write_text(json.dumps({**meta, "num_processes": 2}))
    with pytest.raises(PastaError, match="as many processes.*used 1, .* 2"):
        evaluate(compose("eval", [*EVAL, f"output_dir={run}", "eval.limit=2", "eval.mode=score",
                                  "judge=embedding", "eval.win_rate=false", f"eval.sequential={sequential}",
                                  f"eval.reference={sequential}"]))


@pytest.mark.slow
def test_two_processes_decode_the_same_files_as_one_and_resume_with_one(tmp_path):
    """Greedy outputs and per-prompt stats (timings aside) of a 2-process launch equal one process's, in prompt
    order; a launch stopped after 4 prompts finishes with one process as if it had never stopped."""
    single = eval_run(tmp_path, "single", "eval.limit=6")
    launched = launched_eval_run(tmp_path, "launched", "eval.limit=6")
    assert without_timings(launched) == without_timings(single)
    assert (launched / "model_outputs.json").read_text() == (single / "model_outputs.json").read_text()
    assert json.loads((launched / RUN_META).read_text())["num_processes"] == 2

    launched_eval_run(tmp_path, "switched", "eval.limit=4")
    switched = eval_run(tmp_path, "switched", "eval.limit=6")
    assert without_timings(switched) == without_timings(single)
    assert json.loads((switched / RUN_META).read_text())["num_processes"] == [1, 2]
    assert not list(switched.glob("*.part-*"))


ANNOTATED = Path(__file__).resolve().parents[1] / "data" / "annotated_examples.jsonl"
HELDOUT = Path(__file__).resolve().parents[1] / "data" / "alpaca_sample.jsonl"


def pref_overrides(out: Path, sft: Path, batch_size: int) -> list[str]:
    """One tiny round: 4 prompts x 3 samples, sampled one prompt at a time (a batch's padding cannot then differ
    between process counts), full finetuning (no dropout) with one optimizer step of a global batch of 2."""
    return [
        "stage=pref", "device=cpu", "num_threads=1", f"output_dir={out}", f"model.path={sft}",
        f"data.path={ANNOTATED}", "stage.rounds=1", "stage.prompts_per_round=4", "stage.num_samples=3",
        "stage.max_new_tokens=12", "stage.sample_batch_size=1", "stage.finetune=full", "stage.max_steps=1",
        "stage.mixed_precision=no",  # float32: bf16 rounds 2 processes x 1 and 1 x 2 apart (tests/test_train_ddp.py)
        f"stage.per_device_train_batch_size={batch_size}", "stage.learning_rate=1e-3", "stage.max_length=160",
        "stage.logging_steps=1", "stage.save_steps=100", f"stage.heldout_path={HELDOUT}", "stage.heldout_limit=3",
    ]  # fmt: skip


def assert_close_records(actual, expected, where: str) -> None:
    """Equal JSON, floats within 1e-5 (judge scores of texts embedded in other batches)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), where
        for key in expected:
            assert_close_records(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close_records(a, e, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-5, abs=1e-6), where
    else:
        assert actual == expected, where


@pytest.mark.slow
def test_a_preference_round_on_two_processes_samples_pairs_and_trains_as_one(tiny_model_and_tokenizer, tmp_path):
    import copy

    import torch
    from safetensors.torch import load_file

    from pasta.lang import add_tag_tokens
    from pasta.training.pref import run_pref

    model, tokenizer = (copy.deepcopy(x) for x in tiny_model_and_tokenizer)
    add_tag_tokens(tokenizer, model)
    sft = tmp_path / "sft"
    model.save_pretrained(sft)
    tokenizer.save_pretrained(sft)

    done = accelerate_launch("pasta.train", pref_overrides(tmp_path / "launched", sft, batch_size=1))
    assert done.returncode == 0, done.stderr[-3000:]
    run_pref(compose("train", pref_overrides(tmp_path / "single", sft, batch_size=2)))

    launched, single = tmp_path / "launched", tmp_path / "single"
    for name in ("round-1/scores.jsonl", "round-1/pairs.jsonl", "round-0/heldout.jsonl", "round-1/heldout.jsonl"):
        assert_close_records(read_jsonl(launched / name), read_jsonl(single / name), name)
    assert not list(launched.rglob("*.part-*"))
    expected = load_file(single / "round-1" / "final" / "model.safetensors")
    actual = load_file(launched / "round-1" / "final" / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_processes_annotate_with_the_hf_teacher_as_one_in_input_order(tmp_path):
    from pasta.annotate import annotate

    overrides = [
        "teacher=hf", "model@teacher.model=tiny", "teacher.batch_size=2", "teacher.max_new_tokens_factor=0",
        "teacher.max_new_tokens_extra=4", "data.limit=5", "progress=false", "device=cpu", "num_threads=1",
    ]  # fmt: skip
    done = accelerate_launch("pasta.annotate", [*overrides, f"output={tmp_path / 'launched.jsonl'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    summary = annotate(compose("annotate", [*overrides, f"output={tmp_path / 'single.jsonl'}"]))
    for suffix in ("jsonl", "rejects.jsonl"):
        assert read_jsonl(tmp_path / f"launched.{suffix}") == read_jsonl(tmp_path / f"single.{suffix}")
    launched = json.loads((tmp_path / "launched.summary.json").read_text())
    assert launched["num_records"] == summary["num_records"] == 5
    assert not list(tmp_path.glob("*.part-*"))


def launched_worker(marker: str, rank: int) -> int | None:
    """The pid of the launched worker process of `rank` whose environment holds `marker`, if it is running."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in variables and f"RANK={rank}".encode() in variables:
            return int(environ.parent.name)
    return None


@pytest.mark.slow
def test_a_process_killed_mid_launch_stops_the_run_and_a_one_process_rerun_loses_nothing(tmp_path, monkeypatch):
    """Process 1 is killed (SIGKILL) once it has written an answer: the launch fails, the answers both processes
    wrote stay in their part files, and a one-process rerun decodes only the rest, ending with the same files."""
    import os
    import signal
    import subprocess
    import time

    from helpers import accelerate_launch_command
    from pasta.evaluation import generation

    run = tmp_path / "killed"
    overrides = [*EVAL, f"output_dir={run}", "eval.limit=8", "decode.max_new_tokens=256"]
    command, env = accelerate_launch_command("pasta.eval", overrides)
    marker = f"PASTA_TEST_LAUNCH={tmp_path}"
    launch = subprocess.Popen(command, env={**env, "PASTA_TEST_LAUNCH": str(tmp_path)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    part = run / "stats.part-1.jsonl"
    deadline = time.monotonic() + 300
    while not (part.is_file() and part.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = launched_worker(marker, rank=1)
    assert worker is not None, "process 1 ended before it could be killed"
    os.kill(worker, signal.SIGKILL)
    _, stderr = launch.communicate(timeout=300)
    assert launch.returncode != 0, stderr[-2000:]
    # A process stopped mid-line leaves that line torn; the rerun's appender cuts it, and so does this count.
    for path in run.glob("stats*.jsonl"):
        JsonlAppender(path).close()
    written = [r["instruction"] for p in run.glob("stats*.jsonl") for r in read_jsonl(p)]
    assert written and not (run / "model_outputs.json").exists()

    decoded: list[str] = []
    original = generation.Decoder.__call__
    monkeypatch.setattr(generation.Decoder, "__call__",
                        lambda self, records, **kwargs: decoded.extend(r["instruction"] for r in records)
                        or original(self, records, **kwargs))
    eval_run(tmp_path, "killed", "eval.limit=8", "decode.max_new_tokens=256")
    assert not set(decoded) & set(written) and len(decoded) + len(written) == 8
    single = eval_run(tmp_path, "single", "eval.limit=8", "decode.max_new_tokens=256")
    assert without_timings(run) == without_timings(single)
