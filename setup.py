"""Package layout that pyproject.toml cannot express: `src/pasta` plus the top-level `conf/` as `pasta.conf`.

The Hydra configs live in the checkout's `conf/` (that is where users edit them); an installed wheel carries them
as `pasta/conf/`, which `pasta.config.conf_dir()` finds. Each config folder is declared as a (data-only) package so
that setuptools ships its files; `pasta.data` ships the held-out pool's prompt hashes beside its code, and the
top-level `data/` (the small sample data the default configs read) ships as `pasta/sample_data/`. Everything else is in
pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup

CONF_FILES = ["*.yaml", "*.md", "*.txt", "*.jinja"]
conf_packages = ["pasta.conf"] + sorted(
    "pasta.conf." + ".".join(folder.relative_to("conf").parts)
    for folder in Path("conf").rglob("*")
    if folder.is_dir() and "__pycache__" not in folder.parts
)

setup(
    packages=[*find_packages("src"), *conf_packages, "pasta.sample_data"],
    package_dir={"": "src", "pasta.conf": "conf", "pasta.sample_data": "data"},
    package_data={"pasta.data": ["heldout_pool.txt"], "pasta.sample_data": ["*.jsonl", "*.md"],
                  **{package: CONF_FILES for package in conf_packages}},
)
