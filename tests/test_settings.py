"""A bad setting or a Hydra mistake on the command line: one `error: <key>: <why>` line, exit 2, nothing written;
and free text on the command line (prompt=...) taken literally."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import run_cli
from pasta.cli import literal_overrides
from pasta.config import compose
from pasta.errors import PastaError
from pasta.settings import check_settings


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("lang.reservation.policy=bogus", r"^lang\.reservation\.policy: 'bogus' is not one of exact, scale"),
        ("lang.reservation.multiple=0", r"^lang\.reservation\.multiple: must be an integer >= 1, got 0"),
        ("lang.reservation.fixed=-1", r"^lang\.reservation\.fixed: must be an integer >= 1, got -1"),
        ("lang.reservation.scale=-2", r"^lang\.reservation\.scale: must be a number > 0"),
        ("lang.reservation.multiple=abc", r"^lang\.reservation\.multiple: must be an integer"),
    ],
)
def test_a_reservation_out_of_range_is_refused_naming_the_key(override, message):
    with pytest.raises(PastaError, match=message):
        check_settings(compose("generate", [override, "+prompt=hi"]), "generate")


@pytest.mark.parametrize("config_name", ["train", "eval", "annotate"])
def test_every_stage_that_reads_the_reservation_checks_it(config_name):
    with pytest.raises(PastaError, match=r"^lang\.reservation\.policy: 'bogus'"):
        check_settings(compose(config_name, ["lang.reservation.policy=bogus"]), config_name)


@pytest.mark.parametrize(
    ("config_name", "overrides", "message"),
    [
        ("generate", ["seed=abc"], r"^seed: must be an integer"),
        ("generate", ["num_threads=0"], r"^num_threads: must be an integer >= 1"),
        ("generate", ["device=gpu"], r"^device: 'gpu' is not"),
        ("generate", ["max_new_tokens=0"], r"^max_new_tokens: must be an integer >= 1"),
        ("generate", ["format=xml"], r"^format: 'xml' is not one of text, json"),
        ("generate", ["decode.sampling.temperature=-1"], r"^decode\.sampling\.temperature"),
        ("generate", ["decode=sot"], r"^decode\.kind: 'sot' is not one of async, sequential"),
        ("annotate", ["teacher=openai", "teacher.concurrency=0"], r"^teacher\.concurrency: must be an integer >= 1"),
        ("annotate", ["teacher=openai", "teacher.timeout_s=0"], r"^teacher\.timeout_s: must be a number > 0"),
        ("annotate", ["teacher=openai", "teacher.temperature=nan"], r"^teacher\.temperature: must be a number >= 0"),
        ("annotate", ["teacher=openai", "teacher.max_tokens=0"], r"^teacher\.max_tokens: must be an integer >= 1"),
        ("annotate", ["teacher=hf", "teacher.batch_size=0"], r"^teacher\.batch_size: must be >= 1, got 0$"),
        ("annotate", ["teacher=hf", "teacher.max_new_tokens_factor=nan"],
         r"^teacher\.max_new_tokens_factor: must be >= 0 \(0 = a budget of max_new_tokens_extra alone\), got nan$"),
        ("annotate", ["teacher=hf", "teacher.max_new_tokens_factor=0", "teacher.max_new_tokens_extra=0"],
         r"^teacher\.max_new_tokens_factor=0 and teacher\.max_new_tokens_extra=0 leave the teacher no token"),
        ("annotate", ["on_reject=maybe"], r"^on_reject: 'maybe' is not one of"),
        ("eval", ["judge=openai", "judge.concurrency=0"], r"^judge\.concurrency: must be an integer >= 1"),
        ("eval", ["judge=openai", "judge.max_retries=x"], r"^judge\.max_retries: "),
        ("eval", ["judge=openai", "judge.temperature=-1"], r"^judge\.temperature: must be a number >= 0, got -1"),
        ("eval", ["judge=openai", "judge.max_rating=1"], r"^judge\.max_rating: must be >= 2, got 1$"),
        ("eval", ["judge=openai", "judge.order=sometimes"], r"^judge\.order: must be both or random, got sometimes$"),
        ("eval", ["eval.limit=-1"], r"eval\.limit"),
        ("eval", ["eval_data.on_error=ignore"], r"on_error"),
        ("train", ["stage.per_device_train_batch_size=0"], r"stage\.per_device_train_batch_size"),
        # NaN passed every `x < 0` check: sampling failed at the first step, the judge scored NaN, IPO divided by
        # beta; the hf judge's settings were checked only when the judge was built, after decoding.
        ("generate", ["decode.sampling.temperature=nan"], r"^decode\.sampling\.temperature: must be >= 0 \(0 = greedy\), got nan$"),
        ("eval", ["judge=embedding", "judge.length_control=nan"], r"^judge\.length_control: must be >= 0 \(0 = off\), got nan$"),
        ("eval", ["judge=hf", "judge.batch_size=0"], r"^judge\.batch_size: must be >= 1, got 0$"),
        ("eval", ["judge=hf", "judge.max_rating=10"], r"^judge\.max_rating: must be in 2\.\.9 .*, got 10$"),
        ("eval", ["judge=embedding", "judge.max_seq_length=0"], r"^judge\.max_seq_length: must be >= 1, got 0$"),
        ("train", ["stage=pref", "stage.beta=nan"], r"^stage\.beta: must be > 0 .*, got nan$"),
        ("train", ["stage=pref", "stage.beta=0"], r"^stage\.beta: must be > 0 \(the IPO margin is 1/\(2 beta\)\), got 0\.0$"),
    ],
)
def test_a_bad_setting_is_one_error_naming_its_key(config_name, overrides, message):
    cfg = compose(config_name, [*overrides, "+prompt=hi"] if config_name == "generate" else overrides)
    with pytest.raises(PastaError, match=message):
        check_settings(cfg, config_name)


@pytest.mark.parametrize("config_name", ["generate", "annotate", "eval", "train"])
def test_the_shipped_defaults_pass_the_check(config_name):
    check_settings(compose(config_name, ["+prompt=hi"] if config_name == "generate" else []), config_name)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model=bogus", r"^model: no option 'bogus' \(choose from .*smollm2-135m, tiny\)$"),
        ("decode=bogus", r"^decode: no option 'bogus' \(choose from async, sequential, sot\)$"),
        # A folder given as the option, not as model.path: the option stays whole, and the message says where it goes.
        ("model=outputs/sft/final",
         r"^model: no option 'outputs/sft/final' \(choose from .*\); a model folder goes in model\.path=outputs/sft/final$"),
        ("model=/runs/sft/final", r"^model: no option '/runs/sft/final' \(choose from .*\); a model folder goes in "),
        ("bogus=1", r"^Could not override 'bogus'\. To append to your config use \+bogus=1$"),
        ("prompt=a,b", r"^Ambiguous value for argument"),
    ],
)
def test_hydra_composition_errors_are_one_line(override, message):
    with pytest.raises(PastaError, match=message):
        compose("generate", [override])


@pytest.mark.parametrize(
    "argv",
    [
        ["prompt=hi", "model=bogus"],
        ["prompt=hi", "lang.reservation.policy=bogus"],
        ["prompt=hi", "max_new_tokens=0"],
        ["prompt=hi", "decode.max_threads=[1"],
    ],
)
def test_command_line_mistakes_exit_2_with_one_line_before_the_run_dir_exists(tmp_path, monkeypatch, capsys, argv):
    from pasta.generate import cli

    code, err = run_cli(monkeypatch, capsys, cli, *argv, f"paths.output_root={tmp_path}")
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_the_eval_command_line_refuses_a_bad_reservation_before_writing_run_json(tmp_path, monkeypatch, capsys):
    from pasta.eval import cli

    code, err = run_cli(monkeypatch, capsys, cli, "lang.reservation.policy=bogus", f"output_dir={tmp_path / 'run'}",
                        f"paths.output_root={tmp_path}")
    assert (code, err) == (2, "error: lang.reservation.policy: 'bogus' is not one of exact, scale, round_up, fixed, uncounted\n")
    assert list(tmp_path.iterdir()) == []


def test_hydra_errors_from_a_real_process_are_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pasta.generate", "prompt=hi", "model=bogus", f"paths.output_root={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: model: no option 'bogus'") and result.stderr.count("\n") == 1


# Free text: whatever follows `prompt=` is the prompt, character for character.
@pytest.mark.parametrize(
    "prompt",
    ["What does ${x} mean?", "Apples, pears, plums: which is best?", "it's", "ends with \\", "\\${x}", "a\\'b",
     "[1,2]", "{a: b}", "null", "42", "", "x=y", "${oc.env:HOME}", "'quoted'", "  spaces  "],
)
def test_a_prompt_on_the_command_line_is_taken_literally(prompt):
    assert compose("generate", literal_overrides([f"prompt={prompt}"], ("prompt",))).prompt == prompt


@settings(max_examples=20, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab ,'\"\\${}[]=:#\n\té"), max_size=20))
def test_any_prompt_text_survives_the_command_line(prompt):
    assert compose("generate", literal_overrides([f"prompt={prompt}"], ("prompt",))).prompt == prompt


def test_only_the_free_text_keys_are_quoted():
    assert literal_overrides(["prompt=a,b", "++input=${x}", "seed=1", "-m"], ("prompt", "input")) == [
        "prompt='a,b'", "++input='\\${x}'", "seed=1", "-m"
    ]


def test_models_complete_takes_the_readme_form_plus_an_override(capsys):
    from pasta.models.__main__ import main

    main(["complete", "--prompt", "Name a fruit.", "model=tiny", "device=cpu", "--max-new-tokens", "2"])
    assert capsys.readouterr().out.startswith("user: Name a fruit.\nassistant:")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["complete", "model=tiny", "--max-new-tokens", "0"], "error: --max-new-tokens: must be >= 1, got 0\n"),
        (["complete", "model=bogus"], "error: model: no option 'bogus' (choose from "),
        (["complete", "model=tiny", "lang.reservation.multiple=0"], "error: lang.reservation.multiple: must be "),
    ],
)
def test_models_complete_mistakes_are_one_line(capsys, argv, message):
    from pasta.models.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(message) and err.count("\n") == 1
