"""Teachers: what adds PASTA-LANG tags to existing responses, behind one interface (`Teacher.annotate`).

    from pasta.teachers import build_teacher
    with build_teacher(cfg.teacher, device=cfg.device) as teacher:
        for reply in teacher.annotate(requests): ...

- `structural`: rule-based, no model (pasta/teachers/structural/);
- `hf`: a local transformers model with the teacher prompt (pasta/teachers/hf.py; its settings in hf_config.py,
  which composing a config reads without importing transformers);
- `openai`: any OpenAI-compatible endpoint with the teacher prompt (pasta/teachers/openai_teacher.py).

The configs are the `teacher/` group (conf/teacher/*.yaml); the prompt is conf/prompts/teacher_v2.md
(teacher_v1.md, the convention before rules-v3, stays so that runs recorded with it can be repeated).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from pasta.config import schema_from
from pasta.errors import PastaError
from pasta.teachers.base import (
    EMPTY_REPLY,
    REFUSED,
    TRUNCATED,
    Teacher,
    TeacherError,
    TeacherReply,
    TeacherRequest,
)
from pasta.teachers.prompt import TeacherPrompt
from pasta.teachers.structural import StructuralAnnotator, StructuralConfig, StructuralTeacher

TEACHERS = ("structural", "hf", "openai")


def teacher_config(teacher_cfg: DictConfig | dict[str, Any]) -> Any:
    """The typed config of the teacher a `teacher:` node names (its `kind` key); a bad key is a PastaError."""
    kind = teacher_cfg.get("kind")
    if kind == "structural":
        return schema_from(teacher_cfg, StructuralConfig, "teacher")
    if kind == "hf":
        from pasta.teachers.hf_config import HFTeacherConfig

        return schema_from(teacher_cfg, HFTeacherConfig, "teacher")
    if kind == "openai":
        from pasta.endpoints import check_endpoint_settings
        from pasta.teachers.openai_teacher import OpenAITeacherConfig

        config = schema_from(teacher_cfg, OpenAITeacherConfig, "teacher")
        check_endpoint_settings("teacher", config)
        return config
    raise PastaError(f"teacher.kind: {kind!r} is not one of {', '.join(TEACHERS)}")


def build_teacher(teacher_cfg: DictConfig | dict[str, Any], device: str = "auto") -> Teacher:
    """The teacher a `teacher:` config names (its `kind` key); `device` is for the hf teacher."""
    config = teacher_config(teacher_cfg)
    if config.kind == "structural":
        return StructuralTeacher(config)
    if config.kind == "hf":
        from pasta.teachers.hf import HFTeacher

        return HFTeacher(config, device=device)
    from pasta.teachers.openai_teacher import OpenAITeacher

    return OpenAITeacher(config)


__all__ = [
    "EMPTY_REPLY",
    "REFUSED",
    "TEACHERS",
    "TRUNCATED",
    "StructuralAnnotator",
    "StructuralConfig",
    "StructuralTeacher",
    "Teacher",
    "TeacherError",
    "TeacherPrompt",
    "TeacherReply",
    "TeacherRequest",
    "build_teacher",
    "teacher_config",
]
