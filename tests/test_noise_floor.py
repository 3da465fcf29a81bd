"""scripts/pref_noise_floor.py: the random update it compares a preference round with has the round's size."""

from __future__ import annotations

import copy
import subprocess
import sys

import torch

from helpers.scripts import SCRIPTS, load_script


def test_the_random_update_has_the_rounds_norm_in_every_tensor_and_another_direction(tiny_model_and_tokenizer):
    noise_floor = load_script("pref_noise_floor")
    model = copy.deepcopy(tiny_model_and_tokenizer[0])
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    trained = {name: w + 0.01 * torch.randn(w.shape, generator=generator) for name, w in start.items()}
    noise_floor.random_update_of_size(model, start, trained, seed=0)
    for name, param in model.named_parameters():
        update, round_update = param.detach() - start[name], trained[name] - start[name]
        torch.testing.assert_close(update.norm(), round_update.norm(), rtol=1e-4, atol=1e-6)
        cosine = torch.nn.functional.cosine_similarity(update.flatten(), round_update.flatten(), dim=0)
        assert abs(float(cosine)) < 0.5, name  # a random direction, not the round's


def test_a_wrong_round_folder_or_output_is_refused_before_the_start_policy_is_checked(tmp_path):
    """--round loads only after --start's held-out check (minutes): each input and --out is read first."""
    script = SCRIPTS / "pref_noise_floor.py"
    heldout = SCRIPTS.parent / "data" / "eval_sample.jsonl"
    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "run" / "final" / "config.json").write_text("{}")
    (tmp_path / "a_file").write_text("")
    for flags, says in (
        (["--round", str(tmp_path / "run")], f"--round={tmp_path / 'run'} is not a model folder"),
        (["--round", str(tmp_path / "run" / "final"), "--out", str(tmp_path / "a_file")],
         f"--out={tmp_path / 'a_file'} is a file, not a folder"),
    ):
        done = subprocess.run([sys.executable, str(script), "--start", str(tmp_path / "nowhere"), "--heldout",
                               str(heldout), *flags], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2
        assert done.stderr.strip().startswith(f"error: {says}")
