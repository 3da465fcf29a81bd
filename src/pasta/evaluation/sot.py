"""Skeleton-of-Thought (Ning et al. 2023, arXiv 2307.15337) in pasta's harness, over the sequential decoder.

Per instruction: one request asks for a skeleton (a numbered list of 3-5 word points; the answer is started with
"1." as in the paper), then every point is expanded by its own request, all points of the instruction decoded
together as one batch. Unlike PASTA there is no shared KV cache: each point request re-reads the instruction and
the skeleton (prefill), which is SoT's cost. The answer is the expanded points, one per line.

Stats, so that SoT sits in the same table as PASTA: tokens = skeleton tokens + every point's tokens; steps =
skeleton steps + the longest point's steps (points run in parallel); wall time covers both phases. A skeleton that
yields no numbered point (the model ignored the forced "1.") is kept as the answer as it is, counted in
`malformed["sot_no_points"]`.
"""

from __future__ import annotations

import dataclasses
import re
import time

from pasta.decoding import DecodeConfig, DecodeResult, DecodeStats, decode_sequential
from pasta.decoding.result import BUDGET_CUTS, ENDED_BY_ITSELF
from pasta.evaluation.config import SotConfig
from pasta.models import encode_prompt

_POINT_RE = re.compile(r"^\s*(\d+)\s*[.)]\s*(.+?)\s*$")
OUTLINE_PREFIX = "1."


def parse_outline(text: str, max_points: int) -> list[str]:
    """The points of a numbered skeleton, in order, at most `max_points`; lines that are not points are skipped."""
    points = []
    for line in text.splitlines():
        match = _POINT_RE.match(line)
        if match and match.group(2).strip():
            points.append(match.group(2).strip().rstrip(":"))
    return points[:max_points]


def _first_point_only(text: str, next_index: int) -> str:
    """Cut an expansion that runs on into the next point (small models often do)."""
    match = re.search(rf"\n\s*{next_index}\s*[.)]\s", text)
    return (text[: match.start()] if match else text).strip()


def decode_sot(model, tokenizer, instruction: str, sot: SotConfig, config: DecodeConfig) -> DecodeResult:
    """Answer one instruction with Skeleton-of-Thought; sampling and stop strings come from `config`."""
    started = time.perf_counter()
    outline_request = sot.outline_prompt.format(instruction=instruction)
    outline = decode_sequential(
        model, tokenizer, [encode_prompt(tokenizer, outline_request, answer_start=OUTLINE_PREFIX)],
        dataclasses.replace(config, max_new_tokens=sot.outline_max_new_tokens),
    )[0]
    outline_text = OUTLINE_PREFIX + outline.text
    points = parse_outline(outline_text, sot.max_points)
    stats = DecodeStats(
        num_tokens=outline.stats.num_tokens, num_steps=outline.stats.num_steps, prefill_s=outline.stats.prefill_s,
        finish_reason=outline.stats.finish_reason,
    )
    if not points:
        stats.malformed = {"sot_no_points": 1}
        stats.wall_s = time.perf_counter() - started
        stats.decode_s = stats.wall_s - stats.prefill_s
        answer = outline.text.strip()  # without the "1." that the harness, not the model, wrote
        return DecodeResult(text=answer, annotated=outline_text, token_doc=None, token_ids=outline.token_ids, stats=stats)
    skeleton = "\n".join(f"{index}. {point}" for index, point in enumerate(points, start=1))
    starts = [f"{index}. {point}" for index, point in enumerate(points, start=1)]
    point_prompts = [
        encode_prompt(tokenizer, sot.point_prompt.format(instruction=instruction, outline=skeleton, index=index,
                                                         point=point), answer_start=start)
        for index, (point, start) in enumerate(zip(points, starts, strict=True), start=1)
    ]
    expansions = decode_sequential(
        model, tokenizer, point_prompts, dataclasses.replace(config, max_new_tokens=sot.point_max_new_tokens)
    )
    answer = "\n".join(
        _first_point_only(start + expansion.text, index + 1)
        for index, (start, expansion) in enumerate(zip(starts, expansions, strict=True), start=1)
    )
    stats.num_tokens += sum(expansion.stats.num_tokens for expansion in expansions)
    stats.num_steps += max(expansion.stats.num_steps for expansion in expansions)
    stats.num_threads = len(points)
    # One reason, as every decode records (pasta.decoding.result): a point its budget cut cuts the answer.
    reasons = {expansion.stats.finish_reason for expansion in expansions}
    stats.finish_reason = next(reason for reason in (*BUDGET_CUTS, *ENDED_BY_ITSELF) if reason in reasons)
    stats.wall_s = time.perf_counter() - started
    stats.decode_s = stats.wall_s - stats.prefill_s
    # The skeleton stands in `annotated`, the place where PASTA runs keep their structure.
    return DecodeResult(text=answer, annotated=outline_text, token_doc=None, token_ids=outline.token_ids, stats=stats)
