"""The measurement scripts of the data and teacher work: the SFT subset, the audit sample, the held-out pool file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.scripts import load_script
from pasta.data import read_jsonl
from pasta.data.heldout import POOL_FILE

ROOT = Path(__file__).resolve().parents[1]
ANNOTATED = ROOT / "data" / "annotated_examples.jsonl"


def test_sft_subset_keeps_every_promise_bearing_record_and_as_many_plain_ones(tmp_path):
    plain = [{"instruction": f"Say hi {n}.", "input": "", "output": "Hi.", "annotated": "Hi."} for n in range(30)]
    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in read_jsonl(ANNOTATED) + plain))
    assert load_script("sft_subset").main([str(source), str(tmp_path / "sft.jsonl")]) == 0
    kept = read_jsonl(tmp_path / "sft.jsonl")
    with_promises = [r for r in kept if "<promise" in r["annotated"]]
    assert len(with_promises) == 10 and len(kept) == 20  # 10 of 42 carry promises: those and 10 plain ones


def test_audit_sample_prints_forked_records_with_their_main_thread_and_chunks(capsys):
    assert load_script("teacher_audit_sample").main([str(ANNOTATED), "--num", "2", "--seed", "0"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("=== ") == 2 and "<P:" in printed and "  [" in printed


def test_heldout_pool_script_rewrites_the_shipped_file_unchanged(shared_data_dir, tmp_path, capsys):
    out = tmp_path / "pool.txt"
    assert load_script("heldout_pool").main(["--alpaca-eval", str(shared_data_dir / "alpaca_eval.jsonl"),
                                              "--out", str(out)]) == 0
    assert out.read_text() == POOL_FILE.read_text()


def test_a_script_given_a_broken_file_or_a_folder_for_its_output_says_so_in_one_line(tmp_path):
    half = tmp_path / "half.jsonl"
    half.write_text('{"instruction": "a", "outp', encoding="utf-8")
    commands = [
        ([str(ROOT / "scripts" / "sft_subset.py"), str(half), str(tmp_path / "out.jsonl")], f"error: {half}:1: invalid JSON"),
        ([str(ROOT / "scripts" / "sft_subset.py"), str(ANNOTATED), str(tmp_path)], f"error: {tmp_path}: Is a directory"),
        ([str(ROOT / "scripts" / "teacher_audit_sample.py"), str(half)], f"error: {half}:1: invalid JSON"),
        ([str(ROOT / "scripts" / "heldout_pool.py"), "--out", str(tmp_path)], f"error: --out={tmp_path} is a folder"),
        ([str(ROOT / "scripts" / "heldout_pool.py"), "--alpaca-eval", str(half) + ".absent", "--out", str(tmp_path / "p")],
         f"error: --alpaca-eval={half}.absent: no such file"),
        # judge_validity would judge for minutes before writing: its output is checked first
        ([str(ROOT / "scripts" / "judge_validity.py"), "--out", str(tmp_path)], f"error: --out={tmp_path} is a folder"),
        ([str(ROOT / "scripts" / "study_plot.py"), str(tmp_path), str(tmp_path / "plot.png")],
         f"error: report: '{tmp_path}/*' matches no scored run"),
    ]
    for argv, message in commands:
        result = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
