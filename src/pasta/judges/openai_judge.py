"""An LLM judge over any OpenAI-compatible chat-completions endpoint (OpenAI, Gemini's OpenAI API, vLLM, ...).

`score` asks for a 1..max_rating rating of the candidate (the reference shown as a point of comparison) and parses
the reply; `compare` asks which of two answers is better, shows both orders (or one random order) to cancel position
bias, and reads P("1") against P("2") from the top logprobs when the server returns them, else the text choice.
Retries, errors and the API key follow `pasta.endpoints.Endpoint`'s one policy (shared with the `openai` teacher):
transient failures that outlast the client's `max_retries` and configuration errors (a bad key, an unknown model,
an unreachable endpoint) stop the run with a PastaError (verdicts already saved are kept; a rerun resumes); a
request the server rejects (400/422) gives no verdict for that item, and `max_consecutive_errors` rejections in a
row stop the run. A reply that does not parse is asked again `parse_retries` times. An item without a verdict is
None, never a made-up number. The key never reaches a log or an error line.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from pasta.config import check_ranges
from pasta.endpoints import Endpoint, Rejection, RequestThreads
from pasta.errors import PastaError
from pasta.judges.base import JudgeItem, rating_to_unit
from pasta.judges.prompts import (
    COMPARE_FIELDS,
    NO_REFERENCE,
    PROMPT_HELP,
    SCORE_FIELDS,
    load_prompt,
    parse_choice,
    parse_rating,
)

log = logging.getLogger(__name__)

@dataclass
class OpenAIJudgeConfig:
    """Settings of judge=openai (scores are named "openai:<model>"). For a local vLLM server: judge=openai
    judge.base_url=http://127.0.0.1:8000/v1 judge.model=Qwen/Qwen2.5-7B-Instruct judge.api_key_env=null. The
    endpoint settings have the same names and error policy as the openai teacher's (pasta/endpoints.py)."""

    kind: str = field(default="openai", metadata={"help": "judge type: embedding | openai | hf"})
    base_url: str = field(
        default="https://api.openai.com/v1", metadata={"help": "OpenAI-compatible API root, ending in /v1 for most servers"}
    )
    model: str = field(default="gpt-4o-mini", metadata={"help": "model name sent with every request"})
    api_key_env: str | None = field(
        default="OPENAI_API_KEY",
        metadata={"help": "environment variable holding the API key; null for a server that needs none"},
    )
    concurrency: int = field(default=8, metadata={"help": "requests in flight at once (thread pool size)"})
    max_retries: int = field(
        default=6,
        metadata={"help": "retries with exponential backoff on 429, 5xx, timeouts, no connection (by the openai "
                          "client, honouring retry-after); what still fails stops the run (saved verdicts are "
                          "kept; a rerun resumes)"},
    )
    # Shorter than the teacher's 120 s, whose answers rewrite whole responses.
    timeout_s: float = field(
        default=60.0, metadata={"help": "seconds before one request attempt times out (then retried)"}
    )
    max_consecutive_errors: int = field(
        default=3,
        metadata={"help": "a rejected request (400/422) gives no verdict for its item; this many in a row stop the run"},
    )
    temperature: float = field(
        default=0.0, metadata={"help": "sampling temperature of the judge; 0 for repeatable verdicts"}
    )
    max_tokens: int = field(
        default=16, metadata={"help": "reply length limit; the prompts ask for one number"}
    )
    max_rating: int = field(
        default=10,
        metadata={"help": "score asks for a rating in 1..max_rating, mapped to [0, 1] as (rating - 1) / "
                          "(max_rating - 1)"},
    )
    parse_retries: int = field(
        default=1, metadata={"help": "extra asks when a reply does not parse; after them the item is None"}
    )
    order: str = field(
        default="both",
        metadata={
            "help": "compare: both (each pair in both orders, averaged: cancels position bias, 2 requests per "
            "item) | random (one seeded random order: cancels it on average, 1 request per item)"
        },
    )
    seed: int = field(default=0, metadata={"help": "seed of the random order"})
    use_logprobs: bool = field(
        default=True,
        metadata={"help": "compare: request top logprobs and read P('1') against P('2') (as alpaca_eval's weighted "
                          "judges do); set false for servers that reject them (the text choice then counts as "
                          "certain)"},
    )
    top_logprobs: int = field(default=5, metadata={"help": "how many top logprobs to request per token"})
    score_prompt: str = field(default="judge_score.md", metadata={"help": PROMPT_HELP})
    compare_prompt: str = field(default="judge_compare.md", metadata={"help": PROMPT_HELP})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def validate(self, where: str) -> None:
        check_ranges(self, where, {
            "max_rating": (lambda v: v >= 2, ">= 2"),
            "parse_retries": (lambda v: v >= 0, ">= 0"),
            "order": (lambda v: v in ("both", "random"), "both or random"),
            "top_logprobs": (lambda v: 1 <= v <= 20, "in 1..20 (OpenAI's range)"),
        })


class OpenAIJudge:
    def __init__(self, config: OpenAIJudgeConfig):
        config.validate("judge")  # a config built in code, not composed, is checked here
        self.config = config
        self.name = f"openai:{config.model}"
        self._score_prompt = load_prompt(config.score_prompt, SCORE_FIELDS)
        self._compare_prompt = load_prompt(config.compare_prompt, COMPARE_FIELDS)
        self._endpoint = Endpoint("judge", config)

    def score(self, items: list[JudgeItem]) -> list[float | None]:
        jobs = [lambda item=item: self._score_one(item) for item in items]
        return self._run(jobs, "judge score")

    def compare(self, items: list[JudgeItem]) -> list[float | None]:
        if any(item.reference is None for item in items):
            raise PastaError("compare needs a reference answer for every item")
        if self.config.order == "both":
            orders = [(False, True)] * len(items)
        else:
            rng = random.Random(self.config.seed)
            orders = [(rng.random() < 0.5,) for _ in items]
        jobs, owners = [], []
        for index, (item, swaps) in enumerate(zip(items, orders, strict=True)):
            for swapped in swaps:
                jobs.append(lambda item=item, swapped=swapped: self._compare_one(item, swapped))
                owners.append(index)
        per_order = self._run(jobs, "judge compare")
        grouped: list[list[float | None]] = [[] for _ in items]
        for index, value in zip(owners, per_order, strict=True):
            grouped[index].append(value)
        # One failed order would leave the other's position bias in the average: the item fails as a whole.
        return [None if any(v is None for v in values) else sum(values) / len(values) for values in grouped]

    def _score_one(self, item: JudgeItem) -> float | None:
        messages = self._score_prompt.messages(
            instruction=item.instruction,
            candidate=item.candidate,
            reference=NO_REFERENCE if item.reference is None else item.reference,
            max_rating=str(self.config.max_rating),
        )
        for _ in range(1 + self.config.parse_retries):
            reply = self._ask(messages, with_logprobs=False)
            if reply is None:
                return None
            rating = parse_rating(reply.choices[0].message.content or "", self.config.max_rating)
            if rating is not None:
                return rating_to_unit(rating, self.config.max_rating)
        return None

    def _compare_one(self, item: JudgeItem, swapped: bool) -> float | None:
        """P(candidate beats reference) with the candidate shown second when `swapped`."""
        first, second = (item.reference, item.candidate) if swapped else (item.candidate, item.reference)
        messages = self._compare_prompt.messages(
            instruction=item.instruction, answer_1=first, answer_2=second
        )
        for _ in range(1 + self.config.parse_retries):
            reply = self._ask(messages, with_logprobs=self.config.use_logprobs)
            if reply is None:
                return None
            p_first = first_answer_probability(reply.choices[0])
            if p_first is not None:
                return 1.0 - p_first if swapped else p_first
        return None

    def _ask(self, messages: list[dict[str, str]], with_logprobs: bool) -> Any | None:
        """One chat completion, or None when the endpoint rejected this request (see the module docstring)."""
        extra: dict[str, Any] = (
            {"logprobs": True, "top_logprobs": self.config.top_logprobs} if with_logprobs else {}
        )
        reply = self._endpoint.chat(
            messages, temperature=self.config.temperature, max_tokens=self.config.max_tokens, **extra
        )
        if isinstance(reply, Rejection):
            log.warning("%s: %s", self._endpoint.where, reply)
            return None
        return reply

    def _run(self, jobs: list[Callable[[], float | None]], desc: str) -> list[float | None]:
        results: list[float | None] = [None] * len(jobs)
        with RequestThreads(self.config.concurrency, "judge") as pool:
            futures = {pool.submit(job): index for index, job in enumerate(jobs)}
            try:
                # Closed on the way out too: an error leaves the bar's line ended, and `error:` on a line of its own.
                with tqdm(as_completed(futures), total=len(jobs), desc=desc, disable=not self.config.progress) as bar:
                    for future in bar:
                        results[futures[future]] = future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        num_failed = sum(r is None for r in results)
        if num_failed:
            log.warning("judge %s: %d of %d requests gave no judgement", self.name, num_failed, len(jobs))
        return results


def first_answer_probability(choice: Any) -> float | None:
    """P(answer 1 is better) from one chat completion choice, or None when its reply names no clear choice.

    The text decides which answer was chosen; when the server returned top logprobs at the token that states the
    choice, its probability is the softmax mass of "1" against "2" there (alpaca_eval's weighted judges do the
    same), otherwise the choice counts as certain.
    """
    picked = parse_choice(choice.message.content or "")
    if picked is None:
        return None
    content = getattr(choice.logprobs, "content", None) or []
    for position in content:
        if position.token.strip() in ("1", "2"):
            if position.token.strip() != str(picked):
                break  # the first digit is not the stated choice ("1 is worse than 2"): trust the text
            mass = {"1": 0.0, "2": 0.0}
            for top in position.top_logprobs or []:
                token = top.token.strip()
                if token in mass:
                    mass[token] += math.exp(top.logprob)
            total = mass["1"] + mass["2"]
            if total > 0:
                return mass["1"] / total
            break
    return 1.0 if picked == 1 else 0.0
