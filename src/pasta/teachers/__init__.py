"""Teachers: what adds PASTA-LANG tags to existing responses, behind one interface (`Teacher.annotate`).

    from pasta.teachers import build_teacher
    with build_teacher(cfg.teacher, device=cfg.device) as teacher:
        for reply in teacher.annotate(requests): ...

- `structural`: rule-based, no model (pasta/teachers/structural.py);
- `hf`: a local transformers model with the teacher prompt (pasta/teachers/hf.py);
- `openai`: any OpenAI-compatible endpoint with the teacher prompt (pasta/teachers/openai_teacher.py).

The configs are the `teacher/` group (conf/teacher/*.yaml); the prompt is conf/prompts/teacher_v1.md.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from pasta.errors import PastaError
from pasta.teachers.base import (
    EMPTY_REPLY,
    REFUSED,
    TRUNCATED,
    Teacher,
    TeacherError,
    TeacherReply,
    TeacherRequest,
    config_from,
)
from pasta.teachers.prompt import TeacherPrompt
from pasta.teachers.structural import StructuralAnnotator, StructuralConfig, StructuralTeacher

TEACHERS = ("structural", "hf", "openai")


def build_teacher(teacher_cfg: DictConfig | dict[str, Any], device: str = "auto") -> Teacher:
    """The teacher a `teacher:` config names (its `name` key); `device` is for the hf teacher."""
    raw = (
        OmegaConf.to_container(teacher_cfg, resolve=True)
        if isinstance(teacher_cfg, DictConfig)
        else dict(teacher_cfg)
    )
    name = raw.get("name")
    if name == "structural":
        return StructuralTeacher(config_from(StructuralConfig, raw))
    if name == "hf":
        from pasta.teachers.hf import HFTeacher, HFTeacherConfig

        return HFTeacher(config_from(HFTeacherConfig, raw), device=device)
    if name == "openai":
        from pasta.teachers.openai_teacher import OpenAITeacher, OpenAITeacherConfig

        return OpenAITeacher(config_from(OpenAITeacherConfig, raw))
    raise PastaError(f"teacher.name={name!r} is not one of {', '.join(TEACHERS)}")


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
]
