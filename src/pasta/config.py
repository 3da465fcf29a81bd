"""Where the Hydra configs live, the OmegaConf resolvers they use, and composing a config without a command line.

`conf_dir()` is the one place that decides where configs are: the checkout's top-level `conf/` when pasta runs
from a source tree (editable install), or `pasta/conf/` inside an installed wheel (setup.py ships `conf/` as the
data package `pasta.conf`). Entry points pass it to Hydra as an absolute path, so they work from any directory.

Resolvers registered on import:
  ${pasta_root:}        the checkout root, or the current directory when pasta is installed from a wheel
  ${pasta_user_cache:}  $XDG_CACHE_HOME/pasta, else ~/.cache/pasta

Tests and plain-function callers compose a config with `compose("train", ["stage=sft"])`; every layer turns a
composed node into its typed settings with `schema_from(cfg.stage, SFTSettings, "stage")`. The groups' defaults
come from those same dataclasses, stored in Hydra's ConfigStore (pasta.schemas) before anything is composed.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections.abc import Callable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from pasta.errors import PastaError
from pasta.schemas import register_schemas

_PACKAGE_DIR = Path(__file__).resolve().parent
# A primary config that every layout has; used to tell a real config folder from a stray `conf/`.
_MARKER = "generate.yaml"


def checkout_root() -> Path | None:
    """The source checkout this module runs from (src/pasta/config.py -> repo root), or None when installed."""
    root = _PACKAGE_DIR.parent.parent
    if (root / "pyproject.toml").is_file() and (root / "conf" / _MARKER).is_file():
        return root
    return None


def conf_dir() -> Path:
    """The absolute path of the Hydra config folder (see the module docstring for the search order)."""
    installed = _PACKAGE_DIR / "conf"
    if (installed / _MARKER).is_file():
        return installed
    root = checkout_root()
    if root is not None:
        return root / "conf"
    raise PastaError(
        f"pasta's configs are missing: neither {installed} nor a checkout's conf/ holds {_MARKER}; reinstall pasta"
    )


def _pasta_root() -> str:
    root = checkout_root()
    return str(root if root is not None else Path.cwd())


def _data_dir(root_dir: str) -> str:
    """`<root_dir>/data`; installed from a wheel, the sample data the wheel carries (pasta/sample_data) unless the
    current directory has a data/ folder of its own."""
    local = Path(root_dir) / "data"
    packaged = _PACKAGE_DIR / "sample_data"
    if checkout_root() is None and not local.is_dir() and packaged.is_dir():
        return str(packaged)
    return str(local)


def user_cache_dir() -> str:
    """pasta's default cache folder: $XDG_CACHE_HOME/pasta, else ~/.cache/pasta."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "pasta")


def register_resolvers() -> None:
    """Register pasta's OmegaConf resolvers (idempotent; done on import of this module)."""
    for name, fn in (("pasta_root", _pasta_root), ("pasta_data", _data_dir), ("pasta_user_cache", user_cache_dir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()


def compose(config_name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose a primary config (e.g. "train") with command-line style overrides, as the entry point would.

    Works inside a running Hydra app too: the global Hydra state is saved and restored around the call. Hydra's
    own errors (an unknown group option, a bad override) are a one-line PastaError.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, MissingConfigException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from omegaconf.errors import OmegaConfBaseException

    register_schemas()
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None, job_name=config_name):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except MissingConfigException as exc:
        raise PastaError(_missing_config_message(exc)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        raise PastaError(" ".join(str(exc).split())) from None
    finally:
        restore_gh_from_backup(backup)


# The groups whose options name a place: a path given as the option is meant for their `path` key.
_PATH_GROUPS = {"model": "a model folder", "data": "a file of records", "eval_data": "a file of records"}


def _missing_config_message(exc) -> str:
    """`model: no option 'bogus' (choose from a, b, c)` from Hydra's multi-line message."""
    missing = str(exc.missing_cfg_file or "")
    if not (exc.options and "/" in missing):
        return str(exc).split("\n")[0]
    # Hydra joins group and option with "/": the group is the longest prefix that is a config group (a folder), so an
    # option that is a path (model=outputs/sft/final) stays whole.
    cuts = [i for i, char in enumerate(missing) if char == "/"]
    cut = next((i for i in reversed(cuts) if i > 0 and missing[i - 1] != "/" and (conf_dir() / missing[:i]).is_dir()),
               cuts[-1])
    group, name = missing[:cut], missing[cut + 1:]
    message = f"{group.replace('/', '.')}: no option {name!r} (choose from {', '.join(exc.options)})"
    if group in _PATH_GROUPS and ("/" in name or Path(name).suffix in (".json", ".jsonl") or Path(name).exists()):
        message += f"; {_PATH_GROUPS[group]} goes in {group}.path={name}"
    return message


T = TypeVar("T")

# The one discriminator key of the config groups with several schemas (stage, decode, teacher, judge): its value
# picks the schema. A schema may keep it as a field (a stage's, teacher's or judge's config does); one that has no
# such field (decode's, whose kind picks the decoder rather than a setting of it) does not see it.
KIND = "kind"


def _choice_message(message: str) -> str:
    """OmegaConf's "Invalid value 'x', expected one of [a, b]" in the words of every other check here."""
    match = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", message)
    return f"{match.group(1)!r} is not one of {match.group(2)}" if match else message


def schema_from(node: Any, schema: type[T], where: str, *, only_known: bool = False) -> T:
    """`node` (a composed config node, a dict, or already a `schema`) as a checked instance of the dataclass `schema`.

    Interpolations are resolved first: they may point outside the node (a model's `${paths.cache_dir}`), which a
    merged copy no longer has. The discriminator `kind` reaches only a schema that has it as a field; with
    `only_known` every key the schema lacks is dropped, for a node that other readers share. Types are checked by
    OmegaConf, then the schema's own `validate(where)` runs when it has one. Any problem is one PastaError:
    `<where> config '<name or kind>' is invalid (...); known keys: ...` for an unknown or missing key, else
    `<where>.<key>: <why>`.
    """
    if isinstance(node, schema):
        return node
    raw = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    known = [f.name for f in dataclasses.fields(schema)]  # type: ignore[arg-type]
    raw = {k: v for k, v in raw.items() if k in known or (not only_known and k != KIND)}
    try:
        config = OmegaConf.to_object(OmegaConf.merge(_writable_schema(schema), raw))
    except (ConfigKeyError, MissingMandatoryValue) as exc:
        label = next((key for key in ("name", KIND) if key in known), None)
        name = f" {raw.get(label, '<unnamed>')!r}" if label else ""
        problem = "unknown key" if isinstance(exc, ConfigKeyError) else "missing value for"
        raise PastaError(
            f"{where} config{name} is invalid ({problem} {exc.full_key!r}); known keys: {', '.join(known)}"
        ) from None
    except OmegaConfBaseException as exc:
        key = ".".join(k for k in (where, exc.full_key) if k)
        raise PastaError(f"{key + ': ' if key else ''}{_choice_message(str(exc).splitlines()[0])}") from None
    if hasattr(config, "validate"):
        config.validate(where)
    return config  # type: ignore[return-value]


def check_ranges(settings: Any, where: str, rules: dict[str, tuple[Callable[[Any], bool], str]]) -> None:
    """For a schema's `validate`: refuse the first setting whose value breaks its rule, as one PastaError
    `<where>.<key>: must be <rule>, got <value>`. `rules` maps a (dotted) field name to the test its value must pass
    and the rule in words; write each test so that NaN fails it (`v >= 0`, never `not v < 0`)."""
    for key, (ok, rule) in rules.items():
        value = attrgetter(key)(settings)
        if not ok(value):
            raise PastaError(f"{where + '.' if where else ''}{key}: must be {rule}, got {value}")


def _writable_schema(schema: type) -> DictConfig:
    """The structured config of `schema` with no read-only flag: a frozen dataclass gives read-only nodes, into
    which a merge cannot write."""
    base = OmegaConf.structured(schema)

    def unfreeze(config: Any) -> None:
        OmegaConf.set_readonly(config, None)
        if isinstance(config, DictConfig) and not config._is_none():
            for key in config:
                child = config._get_node(key)
                if OmegaConf.is_config(child):
                    unfreeze(child)

    unfreeze(base)
    return base


def resolve_device(device: str = "auto") -> str:
    """Turn a config's `device` into a torch device string: "auto" is "cuda" when CUDA is available, else "cpu".
    Under `accelerate launch` (torchrun's LOCAL_RANK), "auto" is this process's own GPU."""
    import torch

    if device == "auto":
        if not torch.cuda.is_available():
            return "cpu"
        local_rank = os.environ.get("LOCAL_RANK")
        return "cuda" if local_rank is None else f"cuda:{int(local_rank)}"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PastaError(f"device={device} was asked for but CUDA is not available; use device=auto or device=cpu")
    return device


def setup_runtime(cfg: DictConfig, uses_torch: bool = True) -> None:
    """Apply the keys every primary config has: `seed` (python, numpy, torch) and `num_threads` (torch).

    `uses_torch=False`, for a task that never imports torch (a report), leaves it unimported: its import is most of
    such a command's start."""
    import numpy as np

    seed = cfg.get("seed")
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed)
    if not uses_torch:
        return
    import torch

    if cfg.get("num_threads") is not None:
        torch.set_num_threads(int(cfg.num_threads))
    if seed is not None:
        torch.manual_seed(seed)
