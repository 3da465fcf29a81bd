"""`Choice`: a closed set of config values, as an Enum that OmegaConf checks by name.

A module of its own, with no imports from pasta, so that every layer may use it: pasta.lang's reservation policy
included, which must not import pasta.config (pyproject.toml's import contracts).
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A closed set of config values (OmegaConf checks them by name): equal to, and printed as, its string."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)
