"""The shared shape of every Hydra entry point: config lookup, runtime setup, and one-line errors.

A stage module is a plain function plus one line (pyproject.toml's console scripts point at `<module>:cli`):

    def annotate(cfg: DictConfig) -> Path: ...          # tests call this with pasta.config.compose("annotate")
    cli = run_entry(annotate, "annotate")
    if __name__ == "__main__":
        cli()

The returned function runs `@hydra.main` with the absolute `conf_dir()`, so `--help`, `--cfg job` and overrides
work from any directory. Before the task it applies `seed` and `num_threads` (pasta.config.setup_runtime). A user's mistake
(PastaError, a missing file, Ctrl-C) is printed as `error: <one line>` on stderr with exit code 2, no traceback;
Hydra reports its own config errors (unknown group option, bad override) the same way with exit code 1.
Run directories come from conf/hydra/default.yaml only.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from pasta.config import conf_dir, setup_runtime
from pasta.errors import PastaError

EXIT_USER_ERROR = 2


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"file not found: {exc.filename}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return " ".join(str(exc).split()) or type(exc).__name__


def fail(exc: BaseException) -> None:
    """Print `error: <one line>` to stderr and exit with code 2."""
    print(f"error: {_one_line(exc)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def run_entry(task_fn: Callable[[DictConfig], Any], config_name: str) -> Callable[[], None]:
    """Wrap `task_fn(cfg)` into a `main()` for `python -m ...` and console scripts (see the module docstring)."""

    # functools.wraps keeps task_fn's module and file, from which Hydra names the job (and so the run dir).
    @functools.wraps(task_fn)
    def task(cfg: DictConfig) -> None:
        # Caught here, inside Hydra: errors that escape reach Hydra's reporter, which prints a traceback.
        try:
            setup_runtime(cfg)
            task_fn(cfg)
        except (PastaError, FileNotFoundError, KeyboardInterrupt) as exc:
            fail(exc)

    def main() -> None:
        try:
            hydra.main(version_base=None, config_path=str(conf_dir()), config_name=config_name)(task)()
        except (PastaError, KeyboardInterrupt) as exc:  # raised while Hydra sets up, e.g. conf_dir() missing
            fail(exc)

    main.__doc__ = task_fn.__doc__
    return main
