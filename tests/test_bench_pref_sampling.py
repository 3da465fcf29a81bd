"""scripts/bench_pref_sampling.py on the tiny model: static batches and continuous batching, side by side in one
process, draw the very same candidates (each is seeded by its prompt and sample, not by its batch)."""

from __future__ import annotations

import json

import pytest

from helpers.scripts import load_script


def test_static_and_continuous_batching_draw_the_same_candidates_in_one_run(tmp_path, capsys):
    out = tmp_path / "sampling.json"
    load_script("bench_pref_sampling").main(
        ["--override", "model=tiny", "model.random_init.weight_std=0.3", "--num-prompts", "3", "--num-samples", "2",
         "--batch-size", "1", "--max-new-tokens", "8", "--batching", "both", "--threads", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "continuous over static batches, same process:" in printed and "candidates identical" in printed
    result = json.loads(out.read_text())
    assert result["num_candidates"] == result["static"]["num_candidates"] == 6
    assert result["digest"] == result["static"]["digest"]
    assert result["sampling_s"] > 0 and result["static"]["sampling_s"] > 0


def test_what_the_end_of_the_run_reads_and_writes_is_checked_before_it_samples(tmp_path):
    from pasta.errors import PastaError

    main = load_script("bench_pref_sampling").main
    for flags, says in ((["--compare", str(tmp_path / "none.json")], "--compare not found: "),
                        (["--out", str(tmp_path)], f"--out={tmp_path} is a folder, not a file"),
                        (["--data", str(tmp_path / "none.jsonl")], f"--data={tmp_path / 'none.jsonl'}: no such file")):
        with pytest.raises(PastaError) as info:
            main(["--override", "model=tiny", *flags])
        assert str(info.value).startswith(says)
