"""The settings reference of the docs, generated from the one place each setting is written down.

    python scripts/docs_settings.py            # rewrite the settings sections of the docs pages
    python scripts/docs_settings.py --check    # exit 1 naming the stale pages (tests/test_docs.py runs this check)

A setting's help is its dataclass field's `metadata["help"]` (the schemas of pasta.schemas, which Hydra composes
every group from), and its default is the value the group's default option composes to, or the option's own for
groups whose options have schemas of their own (stage, judge, teacher). The few loose keys of the primary configs
(seed, device, output_dir, conf/train.yaml's data extras, ...) have no dataclass: their help is the comment right
above them in conf/<primary>.yaml. A setting without help stops the script with an error naming it. The import
rules on the design page come from pyproject.toml's [tool.importlinter] contracts.

Each page holds one generated section between `<!-- settings:begin -->` and `<!-- settings:end -->`; the prose
around it is written by hand and left alone.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, NamedTuple

from pasta.errors import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DOCS = ROOT / "docs"
COMMAND = "python scripts/docs_settings.py"
BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"

# Which page documents each config group's settings (the page of the component that owns it).
GROUP_PAGES = {
    "model": "configuration.md",
    "data": "configuration.md",
    "eval_data": "configuration.md",
    "lang": "configuration.md",
    "paths": "configuration.md",
    "teacher": "stages/annotate.md",
    "stage": "stages/train-sft.md",
    "experiment": "stages/train-sft.md",
    "eval": "stages/eval.md",
    "decode": "stages/generate.md",
    "judge": "judges.md",
}
# A primary config each group composes in (its options' values are read from there).
GROUP_PRIMARY = {"teacher": "annotate", "stage": "train", "judge": "train", "decode": "eval", "eval": "eval",
                 "model": "generate", "data": "train", "eval_data": "eval", "lang": "generate"}
# Groups whose options share one schema: one table of the schema, then what each option sets.
SHARED_SCHEMA = {"model": "schema_model", "data": "schema_data", "eval_data": "schema_data",
                 "decode": "schema_decode", "eval": "schema_eval"}
# Groups whose options have schemas of their own: one table per option.
OPTION_SCHEMAS = {"stage": {"sft": "schema_stage_sft", "pref": "schema_stage_pref"},
                  "judge": {k: f"schema_judge_{k}" for k in ("embedding", "hf", "openai")},
                  "teacher": {k: f"schema_teacher_{k}" for k in ("structural", "hf", "openai")}}


# --- what the page spec names ------------------------------------------------------------------------------------


class Primary(NamedTuple):
    """The keys a primary config (conf/<name>.yaml) sets itself, and the groups it reads."""

    name: str


class Group(NamedTuple):
    """Every setting of a config group (`options`: only these of a group whose options have their own schemas)."""

    name: str
    options: tuple[str, ...] = ()


class Lang(NamedTuple):
    """lang.reservation (the schema ReservationPolicy)."""


class Paths(NamedTuple):
    """conf/paths/default.yaml: no schema, its comments are the help."""


class Contracts(NamedTuple):
    """The import rules of pyproject.toml's [tool.importlinter] contracts, which `lint-imports` checks."""


PAGES: dict[str, tuple[Any, ...]] = {
    "stages/annotate.md": (Primary("annotate"), Group("teacher")),
    "stages/train-sft.md": (Primary("train"), Group("stage", ("sft",)), Group("experiment")),
    "stages/train-pref.md": (Primary("train"), Group("stage", ("pref",))),
    "stages/eval.md": (Primary("eval"), Group("eval")),
    "stages/generate.md": (Primary("generate"), Group("decode")),
    "stages/serve.md": (Primary("serve"),),
    "judges.md": (Group("judge"),),
    "configuration.md": (Group("model"), Group("data"), Group("eval_data"), Lang(), Paths()),
    "design.md": (Contracts(),),
}


# --- help and values ---------------------------------------------------------------------------------------------


class MissingHelp(Exception):
    pass


def yaml_comments(path: Path) -> dict[str, str]:
    """`dotted.key -> the comment block right above it` for every key of a YAML file (same indentation, no blank
    line between); the defaults list is skipped."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^(\s*)([A-Za-z_][\w]*):", line)
        if match and not stripped.startswith("-"):
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            key = ".".join([k for _, k in stack] + [match.group(2)])
            stack.append((indent, match.group(2)))
            if block:
                found[key] = " ".join(block)
        block = []
    return found


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(m.value for m in tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else _type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    if dataclasses.is_dataclass(tp):
        return "settings"
    return getattr(tp, "__name__", str(tp))


def _nested_dataclass(tp: Any) -> type | None:
    for candidate in (tp, *typing.get_args(tp)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _value(value: Any) -> str:
    """A default as the table prints it."""
    if value is None:
        return "`null`"
    if value == "???":
        return "required"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        if "name" in value:
            return f"the `{value['name']}` model config"
        return f"`{_inline(value)}`"
    if isinstance(value, str) and ("\n" in value or len(value) > 80):
        lines = value.count("\n") + 1
        return f"text of {lines} line{'s' if lines > 1 else ''} (`--cfg job` prints it)"
    if isinstance(value, list | tuple):
        text = _inline(list(value))
        return f"`{text}`" if len(text) <= 80 else f"a list of {len(value)} (`--cfg job` prints it)"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value}`"


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_inline(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value.value if isinstance(value, enum.Enum) else value)


def _text(help_text: str) -> str:
    """Help text for a table cell: `<`, `>`, `*` and `|` escaped outside code spans."""
    parts = help_text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", r"\*").replace("|", r"\|"))
    return "`".join(parts)


def _row(key: str, type_name: str, default: str, help_text: str) -> str:
    return f"| `{key}` | {_text(type_name)} | {default} | {_text(help_text)} |"


HEADER = ["| setting | type | default | what it does |", "|---|---|---|---|"]


def schema_rows(schema: type, values: dict | None, prefix: str, where: str) -> list[str]:
    """One row per field of `schema` (nested settings flattened to dotted keys), defaults from `values`."""
    rows = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        help_text = f.metadata.get("help")
        if not help_text:
            raise MissingHelp(f"{where}: {schema.__module__}.{schema.__qualname__}.{f.name} has no metadata['help']")
        value = (values or {}).get(f.name)
        nested = _nested_dataclass(hints[f.name])
        if nested is not None and isinstance(value, dict):
            rows.append(_row(key, _type_name(hints[f.name]), "", help_text))
            rows += schema_rows(nested, value, f"{key}.", where)
        elif nested is not None:  # null by default: its fields' own defaults, for when it is set
            rows.append(_row(key, _type_name(hints[f.name]), _value(value), help_text))
            rows += schema_rows(nested, _defaults(nested), f"{key}.", where)
        else:
            rows.append(_row(key, _type_name(hints[f.name]), _value(value), help_text))
    return rows


def _schema(name: str) -> type:
    from pasta.schemas import schema_class

    return schema_class(name)


def _defaults(schema: type) -> dict:
    from pasta.schemas import schema_defaults

    return schema_defaults(schema)


def _compose(primary: str, overrides: list[str]) -> Any:
    from omegaconf import OmegaConf

    from pasta.config import compose

    return OmegaConf.to_container(compose(primary, overrides), resolve=False)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _option_file(group: str, option: str) -> dict:
    """The keys an option file sets itself (its defaults list left out), flattened to dotted keys."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"), resolve=False)
    raw.pop("defaults", None)
    return _flatten(raw)


def _flatten(node: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _setting(key: str, value: Any) -> str:
    """`key=value` of an option's preset, a long text by its length."""
    if isinstance(value, str) and ("\n" in value or len(value) > 60):
        return f"`{key}` (a text of {len(value)} characters)"
    return f"`{key}={_inline(value)}`"


def _first_comment(path: Path) -> str:
    """The first line of a config file's opening comment (a trailing colon, which introduces examples, as a period)."""
    for line in path.read_text().splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            text = line.lstrip("#").strip()
            return text[:-1] + "." if text.endswith(":") else text
    return ""


def _defaults_list(primary: str) -> list[tuple[str, str | None]]:
    """(group, default option) of each group entry in conf/<primary>.yaml's defaults list."""
    from omegaconf import OmegaConf

    groups = []
    for entry in OmegaConf.to_container(OmegaConf.load(CONF / f"{primary}.yaml"))["defaults"]:
        if isinstance(entry, dict):
            (group, option), = entry.items()
            if not str(group).startswith("/"):
                groups.append((str(group), option))
    return groups


# --- sections -----------------------------------------------------------------------------------------------------


def _link(group: str, here: str) -> str:
    """A link from docs/<here> to the section of the page that documents `group`."""
    target = os.path.relpath(DOCS / GROUP_PAGES[group], (DOCS / here).parent)
    return f"[{group}]({target}#group-{group})"


def primary_section(spec: Primary, page: str) -> list[str]:
    from omegaconf import OmegaConf

    path = CONF / f"{spec.name}.yaml"
    comments = yaml_comments(path)
    own = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    defaults = own.pop("defaults")
    lines = [f"### Keys of {spec.name}.yaml", "",
             f"`python -m pasta.{spec.name}` composes `conf/{spec.name}.yaml`; these keys are its own.", ""]
    rows = []
    if "schema_annotate" in defaults:
        schema = _schema("schema_annotate")
        names = {f.name for f in dataclasses.fields(schema)}
        for key, value in _flatten(own).items():
            if key not in names:
                rows.append(_loose_row(key, value, comments, path))
        values = {**_defaults(schema), **{k: v for k, v in own.items() if k in names}}
        rows += schema_rows(schema, values, "", f"conf/{spec.name}.yaml")
    else:
        rows += [_loose_row(key, value, comments, path) for key, value in _flatten(own).items()]
    for entry in defaults:
        if isinstance(entry, str) and entry.startswith("/schema_") and "@" in entry:
            name, node = entry[1:].split("@")
            rows += schema_rows(_schema(name), _defaults(_schema(name)), f"{node}.", f"conf/{spec.name}.yaml")
    lines += [*HEADER, *rows, ""]
    groups = _defaults_list(spec.name)
    if groups:
        lines += [f"### Groups of {spec.name}.yaml", "",
                  "Pick an option with `group=option`; set one key with `group.key=value`.", "",
                  "| group | default option | options | its settings |", "|---|---|---|---|"]
        for group, option in groups:
            if group == "hydra":  # run directories only: Configuration says where runs go
                continue
            opts = ", ".join(f"`{o}`" for o in _options(group))
            lines.append(f"| `{group}` | `{_inline(option)}` | {opts} | {_link(group, page)} |")
        lines.append("")
    return lines


def _loose_row(key: str, value: Any, comments: dict[str, str], path: Path, prefix: str = "") -> str:
    if key not in comments:
        raise MissingHelp(f"{path.relative_to(ROOT)}: `{key}` has no comment right above it")
    type_name = "-" if value is None else type(value).__name__
    if isinstance(value, str) and value.startswith("${"):
        type_name = "str"
    return _row(prefix + key, type_name, _value(value), comments[key])


def group_section(spec: Group, page: str) -> list[str]:
    group = spec.name
    lines = [f"### Group {group}", ""]
    if group == "experiment":
        lines += ["Presets of `python -m pasta.train` (`experiment=<name>`), each a set of overrides over the "
                  "defaults; `experiment=null` (the default) sets nothing.", "",
                  "| option | what it is | what it sets |", "|---|---|---|"]
        for option in _options(group):
            sets = ", ".join(_setting(k, v) for k, v in _option_file(group, option).items())
            lines.append(f"| `{option}` | {_text(_first_comment(CONF / group / f'{option}.yaml'))} | {sets} |")
        return [*lines, ""]
    if group in SHARED_SCHEMA:
        schema = _schema(SHARED_SCHEMA[group])
        primary = GROUP_PRIMARY[group]
        default = dict(_defaults_list(primary))[group]
        values = _compose(primary, [])[group]
        lines += [f"Every option of `{group}/` has these settings (schema `{schema.__qualname__}`). The defaults are "
                  f"those of `{group}={default}`, the default option of `python -m pasta.{primary}`; the options "
                  "below set some of them.", "", *HEADER,
                  *schema_rows(schema, values, f"{group}.", f"group {group}"), "",
                  "| option | what it is | what it sets |", "|---|---|---|"]
        for option in _options(group):
            sets = ", ".join(_setting(k, v) for k, v in _option_file(group, option).items())
            lines.append(f"| `{option}` | {_text(_first_comment(CONF / group / f'{option}.yaml'))} | {sets} |")
        return [*lines, ""]
    for option in spec.options or tuple(OPTION_SCHEMAS[group]):
        schema = _schema(OPTION_SCHEMAS[group][option])
        values = _compose(GROUP_PRIMARY[group], [f"{group}={option}"])[group]
        about = _first_comment(CONF / group / f"{option}.yaml")
        if schema.__qualname__ not in about:
            about += f" Schema `{schema.__qualname__}`."
        lines += [f"#### {group}={option}", "", _text(about), "",
                  *HEADER, *schema_rows(schema, values, f"{group}.", f"{group}={option}"), ""]
    return lines


def lang_section() -> list[str]:
    schema = _schema("schema_lang_reservation")
    return ["### Group lang", "", "`lang/default.yaml`, the one option: PASTA-LANG settings shared by training and "
            "decoding (schema `ReservationPolicy` at `lang.reservation`).", "", *HEADER,
            *schema_rows(schema, _defaults(schema), "lang.reservation.", "group lang"), ""]


def paths_section() -> list[str]:
    from omegaconf import OmegaConf

    path = CONF / "paths" / "default.yaml"
    comments = yaml_comments(path)
    own = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return ["### Group paths", "", "`paths/default.yaml`, the one option: where pasta reads and writes.", "",
            *HEADER, *[_loose_row(key, value, comments, path, prefix="paths.") for key, value in _flatten(own).items()],
            ""]


def contracts_section() -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    lines = ["### The contracts", "",
             "`[tool.importlinter]` in `pyproject.toml`, checked by `lint-imports` "
             "(`tests/test_architecture.py`); imports inside functions count too.", "",
             "| rule | kind | modules |", "|---|---|---|"]
    for contract in contracts:
        if contract["type"] == "forbidden":
            modules = (", ".join(f"`{m}`" for m in contract["source_modules"]) + " may not import "
                       + ", ".join(f"`{m}`" for m in contract["forbidden_modules"]))
        elif contract["type"] == "independence":
            modules = ", ".join(f"`{m}`" for m in contract["modules"]) + " import none of each other"
        else:
            modules = ", ".join(f"`{k}={v}`" for k, v in contract.items() if k not in ("name", "type"))
        lines.append(f"| {_text(contract['name'])} | {contract['type']} | {modules} |")
    return [*lines, ""]


def section(page: str) -> str:
    source = "pyproject.toml" if page == "design.md" else "the dataclasses' help"
    lines = [BEGIN, "", f"<!-- generated by `{COMMAND}` from {source}: edit that, not this -->", ""]
    if page != "design.md":
        lines += ["## Settings", ""]
    for spec in PAGES[page]:
        if isinstance(spec, Primary):
            lines += primary_section(spec, page)
        elif isinstance(spec, Group):
            lines += group_section(spec, page)
        elif isinstance(spec, Lang):
            lines += lang_section()
        elif isinstance(spec, Contracts):
            lines += contracts_section()
        else:
            lines += paths_section()
    while lines[-1] == "":
        lines.pop()
    return "\n".join([*lines, "", END])


def rewrite(text: str, new: str, page: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"error: docs/{page} must hold exactly one {BEGIN} ... {END} section")
    return pattern.sub(lambda _: new, text)


def stale_pages(write: bool) -> list[str]:
    """The pages whose settings section differs from what the schemas give (rewritten when `write`)."""
    new_texts = {}
    for page in PAGES:  # every page first: a setting without help stops the script before any page is written
        text = (DOCS / page).read_text()
        new = rewrite(text, section(page), page)
        if new != text:
            new_texts[page] = new
    if write:
        for page, new in new_texts.items():
            (DOCS / page).write_text(new)
    return [f"docs/{page}" for page in new_texts]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    args = parser.parse_args(argv)
    try:
        stale = stale_pages(write=not args.check)
    except MissingHelp as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check and stale:
        print(f"stale settings reference in {', '.join(stale)}: run `{COMMAND}`", file=sys.stderr)
        return 1
    print(f"{'rewrote' if stale else 'up to date'}: {', '.join(stale) if stale else len(PAGES)} pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
