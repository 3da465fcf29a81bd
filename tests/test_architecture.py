"""The package's dependency rules ([tool.importlinter] in pyproject.toml), checked with import-linter."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LINT_IMPORTS, "--no-cache", *args], cwd=ROOT, capture_output=True, text=True)


def test_every_dependency_rule_of_the_package_is_kept():
    done = lint_imports()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 broken" in done.stdout


def test_a_report_and_the_cost_model_run_without_torch_or_transformers(tmp_path):
    """`pasta.eval report=` and scripts/study_plot.py read summary.json files and price steps on a saved
    step_costs.json: the command, its runtime setup included, and the modules the plot reads import neither torch
    nor transformers (seconds of a report's start), which only decoding and measuring need."""
    code = ("import runpy, sys\n"
            f"sys.argv = ['pasta.eval', 'report={ROOT}/tests/fixtures/eval/*', 'output_dir={tmp_path / 'report'}',\n"
            f"            'hydra.run.dir={tmp_path / 'hydra'}']\n"
            "runpy.run_module('pasta.eval', run_name='__main__')\n"
            "import pasta.evaluation.run_files, pasta.decoding.cost_model, pasta.evaluation.speed, pasta.measure\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "report" / "report.md").is_file()
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_an_import_inside_a_function_breaks_a_rule(tmp_path):
    """The rules see lazy imports: serving/server.py imports the serving engine only inside `build_app`."""
    config = tmp_path / "contracts.toml"
    config.write_text('[tool.importlinter]\nroot_package = "pasta"\n\n[[tool.importlinter.contracts]]\n'
                      'name = "server.py without the serving engine"\ntype = "forbidden"\n'
                      'source_modules = ["pasta.serving.server"]\nforbidden_modules = ["pasta.serving.engine"]\n')
    done = lint_imports("--config", str(config))
    assert done.returncode != 0
    assert "pasta.serving.server -> pasta.serving.engine" in done.stdout


def test_a_command_line_is_composed_and_checked_without_importing_the_model_libraries():
    """Every entry point refuses a bad command line (and prints --help) without importing the libraries that only
    its work needs, torch included: composing a config reads every group's schema, so the schemas' modules
    (pasta.schemas) and the packages that hold them import their torch modules on first use (pasta.lazy). openai
    neither: every start checks the teacher's and the judge's settings, and only a client needs it
    (pasta.endpoints)."""
    code = (
        "import sys\n"
        "from pasta.cli import check_command_line\n"
        "import pasta.annotate, pasta.eval, pasta.generate, pasta.serve, pasta.train\n"
        "for name, overrides in [('annotate', ['teacher=hf']), ('annotate', ['teacher=openai']), ('train', ['stage=sft']),\n"
        "                        ('train', ['stage=pref']), ('eval', []), ('generate', ['prompt=hi']), ('serve', [])]:\n"
        "    check_command_line(name, overrides)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'accelerate', 'alpaca_eval',\n"
        "                         'sentence_transformers', 'fastapi', 'openai') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
