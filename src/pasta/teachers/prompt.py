"""The teacher prompt: a Markdown template file with a system part and a user part.

The file (conf/prompts/teacher_v2.md by default) holds the system message, then a line `<!-- user -->`, then the
user message template in which `{{instruction}}`, `{{input}}` and `{{response}}` are replaced by the record's text.
Swap it with `teacher.prompt=my_prompt` (a name under conf/prompts/) or `teacher.prompt=/path/to/prompt.md`.
teacher_v2 teaches the rules-v3 convention of the structural teacher (markers and leads in the main thread, short
topics); teacher_v1, the older one (chunks hold their whole item), stays so that a run's recorded prompt name can
be used again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from pasta.config import conf_dir
from pasta.data.jsonl import read_text_file
from pasta.errors import PastaError

USER_MARKER = "<!-- user -->"
_PLACEHOLDER = re.compile(r"\{\{(instruction|input|response)\}\}")


@dataclass(frozen=True)
class TeacherPrompt:
    name: str  # file stem, written into the run summary
    system: str
    user_template: str
    sha256: str  # of the file, so a summary says exactly which prompt made the data

    @classmethod
    def load(cls, prompt: str) -> TeacherPrompt:
        """`prompt` is a file path, or a name of a file in conf/prompts/ (with or without `.md`)."""
        path = resolve_prompt_path(prompt)
        text = read_text_file(path)
        if text.count(USER_MARKER) != 1:
            raise PastaError(f"teacher prompt {path} must contain the line {USER_MARKER} exactly once")
        system, user = text.split(USER_MARKER)
        if "{{response}}" not in user:
            raise PastaError(
                f"teacher prompt {path}: the user part (after {USER_MARKER}) has no {{{{response}}}}"
            )
        return cls(path.stem, system.strip(), user.strip(), hashlib.sha256(text.encode()).hexdigest())

    def messages(self, instruction: str, input: str, response: str) -> list[dict[str, str]]:
        """Chat messages for one record: the system part and the filled user template."""
        values = {"instruction": instruction, "input": input, "response": response}
        # One pass over the template: a record whose text contains `{{input}}` is not substituted again.
        user = _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.user_template)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


def resolve_prompt_path(prompt: str) -> Path:
    path = Path(prompt).expanduser()
    if path.is_file():
        return path
    prompts_dir = conf_dir() / "prompts"
    for candidate in (prompts_dir / prompt, prompts_dir / f"{prompt}.md"):
        if candidate.is_file():
            return candidate
    available = ", ".join(sorted(p.stem for p in prompts_dir.glob("teacher*.md")))
    raise PastaError(
        f"teacher prompt {prompt!r} not found: not a file and not in {prompts_dir} ({available})"
    )
