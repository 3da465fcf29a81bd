"""Quality judges shared by the preference stage (pointwise `score`) and evaluation (pairwise `compare`).

    from pasta.judges import JudgeItem, build_judge
    judge = build_judge(cfg.judge)  # conf/judge/{embedding,openai,hf}.yaml
    qualities = judge.score([JudgeItem(instruction, candidate, reference)])  # [0, 1] or None, by judge.name

Kinds: `embedding` (offline default; similarity to the reference answer), `openai` (an LLM judge over any
OpenAI-compatible endpoint), `hf` (a local transformers model read through its answer-token probabilities).
"""

from pasta.judges.base import Judge, JudgeItem
from pasta.judges.factory import build_judge

__all__ = ["Judge", "JudgeItem", "build_judge"]
