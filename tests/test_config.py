"""Config lookup and composition: every option of every config group composes with the primary that uses it into
settings its stage accepts, keeps only what differs from its schema, paths resolve, and an installed
(non-editable) wheel finds its configs from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pasta.config import checkout_root, compose, conf_dir, schema_from
from pasta.data import DataConfig
from pasta.decoding import DECODE_MODES
from pasta.errors import PastaError
from pasta.models import ModelConfig
from pasta.settings import check_settings
from pasta.training.config import Finetune, SFTSettings, settings_from_cfg

PRIMARIES = ("annotate", "train", "eval", "generate")
# Groups whose primary is not found from the defaults lists (added with `+group=...`), or used beyond them.
GROUP_PRIMARIES = {
    "teacher": {"annotate"},
    "stage": {"train"},
    "judge": {"train"},
    "experiment": {"train"},
    "decode": {"generate", "eval"},
    "eval": {"eval"},
    "eval_data": {"eval"},
}
# Folders under conf/ that are not config groups: Hydra's own settings are composed by every entry point (tested
# through the run directory in test_entry_points.py); prompts are text files read by the stages; accelerate holds
# `accelerate launch --config_file` files.
NOT_GROUPS = {"hydra", "prompts", "accelerate"}


def _defaults_groups(primary: str) -> set[str]:
    """Group names in a primary config's defaults list (`- model: smollm2-135m` -> model)."""
    defaults = OmegaConf.load(conf_dir() / f"{primary}.yaml").get("defaults", [])
    groups = set()
    for entry in defaults:
        if isinstance(entry, str) or entry is None:
            continue
        for key in entry:
            groups.add(str(key).split(" ")[-1].lstrip("/").split("@")[0])  # "override /model@x" -> model
    return groups


def _group_options() -> list[tuple[str, str]]:
    options = []
    for yaml_file in sorted(conf_dir().rglob("*.yaml")):
        group = yaml_file.parent.relative_to(conf_dir()).as_posix()
        if group != "." and group.split("/")[0] not in NOT_GROUPS:
            options.append((group, yaml_file.stem))
    return options


def _primaries_for(group: str) -> set[str]:
    top = group.split("/")[0]
    return GROUP_PRIMARIES.get(top, set()) | {p for p in PRIMARIES if group in _defaults_groups(p)}


def test_conf_dir_is_absolute_and_holds_every_primary():
    assert conf_dir().is_absolute()
    for primary in PRIMARIES:
        assert (conf_dir() / f"{primary}.yaml").is_file()


@pytest.mark.parametrize("primary", PRIMARIES)
def test_primary_composes_with_the_shared_keys(primary):
    cfg = compose(primary)
    for key in ("seed", "device", "num_threads", "paths", "model", "lang"):
        assert key in cfg, f"{primary}.yaml lacks {key}"
    assert cfg.device == "auto"
    assert cfg.model.name == "smollm2-135m"
    OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize(("group", "option"), _group_options(), ids=lambda v: v)
def test_every_group_option_composes_with_its_primaries_to_valid_settings(group, option):
    primaries = _primaries_for(group)
    assert primaries, f"config group {group}/ is used by no primary: list it in GROUP_PRIMARIES of {__file__}"
    for primary in sorted(primaries):
        prefix = "" if group in _defaults_groups(primary) else "+"
        cfg = compose(primary, [f"{prefix}{group}={option}"])
        resolved = OmegaConf.to_container(cfg, resolve=True)
        if group == "model":
            assert schema_from(cfg.model, ModelConfig, "model").name == option
        if group in ("data", "eval_data"):
            assert schema_from(cfg[group], DataConfig, group, only_known=True).name == option
        assert resolved["paths"]["root_dir"]
        if group == "decode" and primary == "generate" and option not in DECODE_MODES:
            with pytest.raises(PastaError, match=r"^decode\.kind: "):  # decode=sot is pasta.eval's only
                check_settings(cfg, primary)
        else:
            check_settings(cfg, primary)  # every group through the typed view its stage reads it with


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml")))
def test_each_experiment_preset_picks_the_stage_it_is_named_for_with_valid_settings(experiment):
    settings = settings_from_cfg(compose("train", [f"experiment={experiment}"]).stage)
    assert settings.kind == experiment.rsplit("_", 1)[1]


def test_a_preference_key_under_stage_sft_is_refused_naming_it():
    cfg = compose("train", ["stage=sft", "+stage.num_samples=4"])
    with pytest.raises(PastaError, match="num_samples"):
        settings_from_cfg(cfg.stage)


def test_groups_each_primary_names_exist():
    for primary in PRIMARIES:
        for group in _defaults_groups(primary) - {"hydra", "_self_"}:
            assert (conf_dir() / group).is_dir(), f"{primary}.yaml names a missing group {group}/"


def test_unknown_model_name_is_a_config_error_naming_the_group():
    with pytest.raises(PastaError, match=r"^model: no option 'no-such-model' \(choose from .*tiny\)$"):
        compose("generate", ["model=no-such-model"])


def test_paths_point_into_the_checkout():
    paths = compose("generate").paths
    root = checkout_root()
    assert root is not None and Path(paths.root_dir) == root
    assert (Path(paths.data_dir) / "alpaca_sample.jsonl").is_file()
    assert Path(paths.output_root).is_absolute() and Path(paths.cache_dir).is_absolute()


def test_environment_variables_move_cache_output_and_shared_data(monkeypatch, tmp_path):
    monkeypatch.setenv("PASTA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PASTA_OUTPUT_ROOT", str(tmp_path / "out"))
    monkeypatch.setenv("PASTA_SHARED_DATA", str(tmp_path / "shared"))
    paths = compose("generate").paths
    assert (paths.cache_dir, paths.output_root, paths.shared_data_dir) == (
        str(tmp_path / "cache"), str(tmp_path / "out"), str(tmp_path / "shared"))
    assert compose("generate").model.cache_dir == str(tmp_path / "cache" / "models")


@pytest.mark.slow
def test_installed_wheel_finds_its_configs_from_another_directory(tmp_path):
    """Build a wheel from a copy of the sources, install it into a folder, compose from an unrelated cwd."""
    root = checkout_root()
    src = tmp_path / "src-copy"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(root / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(root / "src", src / "src", ignore=ignore)
    shutil.copytree(root / "conf", src / "conf", ignore=ignore)
    shutil.copytree(root / "data", src / "data", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "wheel", src],
                   check=True, cwd=src, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("pasta-*.whl")
    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", target, wheel], check=True, capture_output=True)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = (
        "import pasta, pasta.config as c;"
        "cfg = c.compose('eval', ['model=tiny']);"
        "print(pasta.__file__); print(c.conf_dir()); print(cfg.paths.root_dir); print(cfg.model.name);"
        "from pasta.data import load_alpaca_eval; print(len(load_alpaca_eval(cfg.eval_data)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(target)})
    assert out.returncode == 0, out.stderr
    module_file, config_dir, root_dir, model_name, num_prompts = out.stdout.split()
    assert Path(module_file).is_relative_to(target)
    assert Path(config_dir) == target / "pasta" / "conf"
    assert Path(root_dir) == elsewhere  # no checkout: paths are relative to where the user runs pasta
    assert model_name == "tiny"
    assert num_prompts == "25"  # the default eval_data=sample, from the sample data the wheel carries


# The groups whose options extend a schema of pasta.schemas (directly, or through another option of the group).
SCHEMA_GROUPS = ("model", "data", "eval_data", "decode", "eval", "stage", "judge", "teacher")


def _preset_and_base(group: str, option: str):
    """(the option's own keys, what its defaults list gives it before them: its schema's defaults, then the options
    of the same group it extends)."""
    from pasta.schemas import schema_class, schema_defaults

    preset = OmegaConf.to_container(OmegaConf.load(conf_dir() / group / f"{option}.yaml"))
    base = OmegaConf.create()
    for entry in preset.pop("defaults", []):
        if isinstance(entry, str) and entry.startswith("/schema_"):
            base = OmegaConf.merge(base, schema_defaults(schema_class(entry[1:].split("@")[0])))
        elif isinstance(entry, str) and entry != "_self_":
            parent_preset, parent_base = _preset_and_base(group, entry)
            base = OmegaConf.merge(base, parent_base, parent_preset)
    return preset, OmegaConf.to_container(base)


def _repeated_defaults(preset, base, where: str = "") -> list[str]:
    """Keys of `preset` set to exactly their value in `base` (True and 1 are not the same value here)."""
    repeated = []
    for key, value in preset.items():
        default = base.get(key, "???")
        if isinstance(value, dict) and isinstance(default, dict):
            repeated += _repeated_defaults(value, default, f"{where}{key}.")
        elif value == default and isinstance(value, bool) == isinstance(default, bool):
            repeated.append(f"{where}{key}={value!r}")
    return repeated


@pytest.mark.parametrize(
    ("group", "option"), [(g, o) for g, o in _group_options() if g in SCHEMA_GROUPS], ids=lambda v: v
)
def test_an_option_keeps_only_what_differs_from_its_schema(group, option):
    """The dataclass is the one place a default lives (pasta.schemas): a YAML key set to the value its schema (or
    the option it extends) already gives is a default in two places, which drift apart (conf/stage/pref.yaml once
    said batch 4 where PrefSettings said 8)."""
    preset, base = _preset_and_base(group, option)
    assert base, f"conf/{group}/{option}.yaml names no schema in its defaults list (- /schema_<name>@_here_)"
    assert not _repeated_defaults(preset, base), f"conf/{group}/{option}.yaml repeats defaults"


def test_schema_from_names_an_unknown_key_a_missing_one_and_a_bad_value():
    from pasta.data import DataConfig
    from pasta.evaluation.config import EvalConfig

    with pytest.raises(PastaError, match=r"^model config 'x' is invalid \(unknown key 'hub'\); known keys: name, hub_id"):
        schema_from({"name": "x", "hub": "typo/model"}, ModelConfig, "model")
    with pytest.raises(PastaError, match=r"^data config '<unnamed>' is invalid \(missing value for 'name'\)"):
        schema_from({"path": "x.jsonl"}, DataConfig, "data")
    with pytest.raises(PastaError, match=r"^eval\.batch_size: Value 'many' of type 'str' could not be converted"):
        schema_from({"batch_size": "many"}, EvalConfig, "eval")
    with pytest.raises(PastaError, match=r"^eval\.limit: must be >= 1 or null, got 0"):  # the schema's validate()
        schema_from(compose("eval", ["eval.limit=0"]).eval, EvalConfig, "eval")


def test_schema_from_keeps_the_callers_keys_out_and_fills_frozen_nested_schemas():
    from pasta.decoding import DecodeConfig

    config = schema_from(compose("generate", ["decode.stop_strings=[END]", "decode.sampling.top_k=5"]).decode,
                         DecodeConfig, "decode")
    assert (config.stop_strings, config.sampling.top_k) == (("END",), 5)
    assert schema_from(config, DecodeConfig, "decode") is config
    data = schema_from({"name": "d", "strip_annotations": True}, DataConfig, "data", only_known=True)
    assert data.name == "d"


def test_the_discriminator_kind_reaches_only_a_schema_with_that_field():
    from pasta.decoding import DecodeConfig
    from pasta.teachers import StructuralConfig

    assert schema_from({"kind": "sequential", "max_new_tokens": 4}, DecodeConfig, "decode").max_new_tokens == 4
    assert schema_from({"kind": "structural"}, StructuralConfig, "teacher").kind == "structural"
    # an unknown key names the config by its kind, as it names a model or data config by its name
    with pytest.raises(PastaError, match=r"^stage config 'sft' is invalid \(unknown key 'batch_size'\)"):
        schema_from(compose("train", ["stage=sft", "+stage.batch_size=2"]).stage, SFTSettings, "stage")


@pytest.mark.parametrize(
    ("config_name", "override", "message"),
    [
        ("train", "stage.finetune=qlora", "stage.finetune: 'qlora' is not one of lora, full"),
        ("train", "stage.mixed_precision=fp8", "stage.mixed_precision: 'fp8' is not one of auto, no, bf16, fp16"),
        ("eval", "eval.timing=fast", "eval.timing: 'fast' is not one of wall, throughput"),
    ],
)
def test_a_closed_choice_outside_its_set_is_one_line_naming_the_choices(config_name, override, message):
    with pytest.raises(PastaError) as caught:
        check_settings(compose(config_name, [override]), config_name)
    assert str(caught.value) == message


def test_a_closed_choice_reads_as_its_enum_and_still_equals_and_prints_as_its_string():
    settings = settings_from_cfg(compose("train", ["stage=sft", "stage.finetune=full"]).stage)
    assert settings.finetune is Finetune.full
    assert settings.finetune == "full" and f"{settings.finetune}" == "full" and str(settings.finetune) == "full"


@pytest.mark.parametrize(("override", "message"), [
    ("eval.bootstrap.num_resamples=0", r"^eval\.bootstrap\.num_resamples: must be >= 1, got 0"),
    ("eval.bootstrap.confidence=2", r"^eval\.bootstrap\.confidence: must be in \(0, 1\), got 2"),
    ("eval.bootstrap.seed=-1", r"^eval\.bootstrap\.seed: must be >= 0, got -1$"),
    ("eval.sot.max_points=0", r"^eval\.sot\.max_points: must be >= 1, got 0$"),
])
def test_bootstrap_and_sot_settings_are_checked_before_anything_is_decoded(override, message):
    from pasta.evaluation.config import EvalConfig

    with pytest.raises(PastaError, match=message):
        schema_from(compose("eval", [override]).eval, EvalConfig, "eval")


def test_a_win_rate_by_the_embedding_judge_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    from pasta.evaluation.dispatch import evaluate

    monkeypatch.setattr("pasta.evaluation.generation.generate_run", lambda *args: pytest.fail("decoded"))
    cfg = compose("eval", ["model=tiny", "judge=embedding", f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(PastaError, match=r"^judge=embedding only measures similarity .* eval\.win_rate=false"):
        evaluate(cfg)
    assert not (tmp_path / "run").exists()
