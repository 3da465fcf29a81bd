"""Package layout that pyproject.toml cannot express: `src/pasta` plus the top-level `conf/` as `pasta.conf`.

The Hydra configs live in the checkout's `conf/` (that is where users edit them); an installed wheel carries them
as `pasta/conf/`, which `pasta.config.conf_dir()` finds. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages("src"), "pasta.conf"],
    package_dir={"": "src", "pasta.conf": "conf"},
)
