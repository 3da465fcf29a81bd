"""The config schemas in Hydra's ConfigStore: the one source of every config group's defaults and help text.

Each dataclass a stage reads a group with (`schema_from(cfg.stage, SFTSettings, "stage")`) is stored under a
root-level name, `schema_<group>[_<kind>]`; each option of the group names its schema first in its defaults list

    defaults:
      - /schema_stage_sft@_here_
      - _self_

and keeps only what differs from it (a preset). The help text of a setting is its field's `metadata["help"]`.

The stored node is the schema's defaults as a plain dict, not the structured config: a structured node would check
types while Hydra composes (with a message that hides the key and the reason), and a frozen dataclass gives
read-only nodes that a preset cannot write into. The types, unknown keys and `validate()` are checked by
`pasta.config.schema_from` when a stage reads its group, as before. Root-level names keep the schemas out of the
groups' options (`--help`, `stage=<option>` and its `choose from ...` message).
"""

from __future__ import annotations

import functools
import importlib

from omegaconf import OmegaConf

# By "module:Class", as Hydra's `_target_` names a class: every layer composes configs through pasta.config,
# pasta.lang's own tool included, and none of them may import the stages these schemas belong to (pyproject.toml's
# import contracts); the classes are imported when they are registered.
SCHEMAS = {
    "schema_model": "pasta.models.config:ModelConfig",
    "schema_lang_reservation": "pasta.lang.reservation:ReservationPolicy",  # lang/: its `reservation` node
    "schema_data": "pasta.data.instructions:DataConfig",  # data/ and eval_data/
    "schema_decode": "pasta.decoding.config:DecodeConfig",  # async, sequential and sot set only `kind`
    "schema_eval": "pasta.evaluation.config:EvalConfig",
    "schema_annotate": "pasta.annotation.config:AnnotateConfig",  # conf/annotate.yaml's own keys
    "schema_serve_limits": "pasta.serving.server:ServeLimits",  # conf/serve.yaml's limits
    "schema_stage_sft": "pasta.training.config:SFTSettings",
    "schema_stage_pref": "pasta.training.config:PrefSettings",
    "schema_judge_embedding": "pasta.judges.embedding:EmbeddingJudgeConfig",
    "schema_judge_hf": "pasta.judges.hf_config:HFJudgeConfig",
    "schema_judge_openai": "pasta.judges.openai_judge:OpenAIJudgeConfig",
    "schema_teacher_structural": "pasta.teachers.structural.config:StructuralConfig",
    "schema_teacher_hf": "pasta.teachers.hf_config:HFTeacherConfig",
    "schema_teacher_openai": "pasta.teachers.openai_teacher:OpenAITeacherConfig",
}


def schema_class(name: str) -> type:
    """The dataclass stored under `name` (a key of SCHEMAS)."""
    module, cls = SCHEMAS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def schema_defaults(schema: type) -> dict:
    """The defaults of the dataclass `schema` as plain containers; a field with no default is `???` (mandatory)."""
    return OmegaConf.to_container(OmegaConf.structured(schema), enum_to_str=True)  # type: ignore[return-value]


@functools.cache
def register_schemas() -> None:
    """Store every schema's defaults in Hydra's ConfigStore (once per process; before any config is composed)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name in SCHEMAS:
        store.store(name=name, node=schema_defaults(schema_class(name)))
