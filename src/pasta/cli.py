"""The shared shape of every Hydra entry point: config lookup, runtime setup, and one-line errors.

A stage module is a plain function plus one line (pyproject.toml's console scripts point at `<module>:cli`):

    def annotate(cfg: DictConfig) -> Path: ...          # tests call this with pasta.config.compose("annotate")
    cli = run_entry(annotate, "annotate")
    if __name__ == "__main__":
        cli()

The returned function runs `@hydra.main` with the absolute `conf_dir()`, so `--help`, `--cfg job` and overrides
work from any directory; the config schemas are put in Hydra's ConfigStore first (pasta.schemas). Before Hydra
starts (and creates the run directory) it composes the config once and checks every setting (pasta.settings), so
Hydra's own errors (an unknown group option such as `model=bogus`, a bad override) and a bad value give one
`error: <key>: <why>` line and exit code 2, with nothing written. Free-text keys (`literal_keys`, e.g. generate's
`prompt`) are taken literally: `prompt=What does ${x} mean, then?` is quoted and escaped for Hydra here, so
neither `${...}` nor a comma is interpreted. Before the task it applies `seed` and `num_threads`
(pasta.config.setup_runtime) and puts `pasta.errors.redact` on every log handler. A user's mistake (PastaError, a
missing file, Ctrl-C, what the file system refuses: a full disk, a read-only place) is printed as `error: <one
line>` on stderr, redacted, with exit code 2, no traceback. Run directories come from conf/hydra/default.yaml only.
"""

from __future__ import annotations

import errno
import functools
import re
import sys
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from pasta.config import compose, conf_dir, setup_runtime
from pasta.errors import PastaError, install_log_redaction, one_line, register_env_secrets
from pasta.schemas import register_schemas

EXIT_USER_ERROR = 2


# What the file system refuses, not bugs: a folder or file where the other is wanted, no permission, a read-only or
# full disk, a file over the size limit. A stage checks its output paths first (pasta.data.paths); these come from
# writes during the run (pasta.data's writers name their file in the error).
_REFUSALS = {errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
             errno.EDQUOT, errno.EFBIG}


def is_file_system_refusal(exc: BaseException) -> bool:
    """An OSError of _REFUSALS that names its file: the user's to fix, printed as `<file>: <why>`."""
    return isinstance(exc, OSError) and exc.errno in _REFUSALS and bool(exc.filename)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"file not found: {exc.filename}"
    if is_file_system_refusal(exc):
        return one_line(f"{exc.filename}: {exc.strerror}")
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return one_line(str(exc)) or type(exc).__name__


def child_error(output: str) -> str:
    """Why a pasta command run as a child process failed, from its output: its last `error:` line (every entry point
    ends on one), else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return said[-1] if said else (lines[-1] if lines else "no output")


def fail(exc: BaseException) -> None:
    """Print `error: <one line>` (redacted) to stderr and exit with code 2."""
    print(f"error: {_one_line(exc)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def run_script(main: Callable[[], Any]) -> None:
    """A script's `if __name__ == "__main__":` body: a user's mistake (PastaError, a file it cannot read or write,
    Ctrl-C) is one `error:` line and exit code 2, as at the entry points; an int that `main` returns is the exit
    code."""
    try:
        code = main()
    except (PastaError, OSError, KeyboardInterrupt) as exc:
        fail(exc)
    sys.exit(code if isinstance(code, int) else 0)


def quote_literal(value: str) -> str:
    """`value` as a Hydra quoted string that OmegaConf reads back unchanged: no interpolation, commas allowed."""
    # In a quoted Hydra value a backslash escapes only a quote or the backslashes right before a quote, and `\${`
    # stops the interpolation; OmegaConf then reads `\${` back as a literal `${`.
    escaped = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", escaped)
    escaped = re.sub(r"(\\+)\Z", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def literal_overrides(overrides: list[str], literal_keys: tuple[str, ...]) -> list[str]:
    """The command-line overrides with the values of `literal_keys` (`key=`, `+key=`, `++key=`) quoted literally."""
    quoted = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key.lstrip("+") in literal_keys:
            override = f"{key}={quote_literal(value)}"
        quoted.append(override)
    return quoted


# Hydra flags after which no task runs (help, config printing, shell completion), or that change which config is
# composed: the check is left to Hydra then.
_UNCHECKED_FLAGS = {
    "--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--config-path",
    "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--package", "-p", "--experimental-rerun",
}
_MULTIRUN_FLAGS = {"--multirun", "-m"}


def check_command_line(config_name: str, argv: list[str]) -> None:
    """Compose the config the command line asks for and check its settings; PastaError on the first problem.

    A multirun's sweeps (`a=1,2`) are not a single config: its overrides are only parsed.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from pasta.settings import check_settings

    if any(arg.split("=")[0] in _UNCHECKED_FLAGS for arg in argv):
        return
    overrides = [arg for arg in argv if not arg.startswith("-")]
    if any(arg in _MULTIRUN_FLAGS for arg in argv):
        try:
            OverridesParser.create().parse_overrides(overrides)
        except HydraException as exc:
            raise PastaError(one_line(str(exc))) from None
        return
    check_settings(compose(config_name, overrides), config_name)


def run_entry(
    task_fn: Callable[[DictConfig], Any],
    config_name: str,
    literal_keys: tuple[str, ...] = (),
    uses_torch: Callable[[DictConfig], bool] = lambda cfg: True,
) -> Callable[[], None]:
    """Wrap `task_fn(cfg)` into a `main()` for `python -m ...` and console scripts (see the module docstring).

    `uses_torch(cfg)` False: the task never imports torch, so the runtime setup does not seed or import it."""

    # functools.wraps keeps task_fn's module and file, from which Hydra names the job (and so the run dir).
    @functools.wraps(task_fn)
    def task(cfg: DictConfig) -> None:
        # Caught here, inside Hydra: errors that escape reach Hydra's reporter, which prints a traceback.
        try:
            install_log_redaction()
            setup_runtime(cfg, uses_torch(cfg))
            task_fn(cfg)
        except (PastaError, FileNotFoundError, KeyboardInterrupt) as exc:
            fail(exc)
        except OSError as exc:
            if not is_file_system_refusal(exc):
                raise
            fail(exc)

    def main() -> None:
        try:
            register_env_secrets()
            sys.argv[1:] = literal_overrides(sys.argv[1:], literal_keys)
            check_command_line(config_name, sys.argv[1:])
        except (PastaError, KeyboardInterrupt) as exc:
            fail(exc)
        try:
            register_schemas()
            hydra.main(version_base=None, config_path=str(conf_dir()), config_name=config_name)(task)()
        except (PastaError, KeyboardInterrupt) as exc:  # raised while Hydra sets up, e.g. conf_dir() missing
            fail(exc)

    main.__doc__ = task_fn.__doc__
    return main
