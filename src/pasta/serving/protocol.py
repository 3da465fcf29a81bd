"""The OpenAI API's request and response bodies that the server speaks (pydantic; FastAPI validates with them).

Requests accept OpenAI's field names with OpenAI's strict types (`"max_tokens": "8"`, `"max_tokens": true` or
`"stream": "yes"` are a 400, not coerced; an integer is a number); unknown fields are ignored as OpenAI's own server
ignores fields it does not know, but fields that would change the answer and that the decoder does not implement
(logprobs, top_logprobs, penalties, tools, tool_choice, response_format; best_of, suffix and echo on completions)
are refused with a 400 rather than silently dropped, unless they hold their default value. `seed` is what a torch
generator takes: -2**63 to 2**64 - 1. `temperature`, `top_p`, `max_tokens` left out take the server's decode
config. Each choice carries a `pasta` object: the decoder's stats, and the annotated text when the request sets
`"pasta": {"annotated": true}` (the openai client: `extra_body={"pasta": {...}}`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

# What torch.Generator.manual_seed takes; choice i of n samples with seed + i.
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1


def _encodable(value: str) -> str:
    # JSON's \ud800 escapes decode to lone surrogates, which no tokenizer encodes: a 400 here, not a 500 there.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_encodable)]


class _Strict(BaseModel):
    """A request's part: OpenAI's types, not coerced (an int is accepted where a number is asked, as JSON has one
    number type)."""

    model_config = ConfigDict(strict=True)


class PastaOptions(_Strict):
    model_config = ConfigDict(extra="forbid")

    annotated: bool = Field(default=False, description="add the annotated PASTA-LANG text to each choice")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Generation(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=MIN_SEED, le=MAX_SEED)
    stop: Text | list[Text] | None = None
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    pasta: PastaOptions | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    def unsupported(self) -> str | None:
        """The first field set that the decoder does not implement, or None."""
        for name in ("logprobs", "top_logprobs", "presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return name
        return None


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None

    def unsupported(self) -> str | None:
        if self.tools:
            return "tools"
        if self.tool_choice not in (None, "none"):
            return "tool_choice"
        if self.response_format not in (None, {"type": "text"}):
            return "response_format"
        return super().unsupported()


class CompletionRequest(_Generation):
    prompt: Text = Field(min_length=1)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.best_of not in (None, 1):
            return "best_of"
        if self.suffix:
            return "suffix"
        return super().unsupported()


class PastaStats(BaseModel):
    """The decoder's account of one choice."""

    num_tokens: int  # tokens sampled by every thread
    num_steps: int  # forward steps the sequence took part in
    num_threads: int  # chunk threads forked
    theoretical_speedup: float  # num_tokens / num_steps
    malformed: dict[str, int]  # malformed-output events by kind
    finish_reason: str  # the decoder's: eos, stop_string, max_new_tokens, max_total_tokens
    annotated: str | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str
    pasta: PastaStats


class _Answer(BaseModel):
    """What every answer body opens with; each kind names its `object` and adds its choices and usage."""

    id: str
    object: str
    created: int
    model: str


class ChatCompletion(_Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: str | None = None
    pasta: PastaStats | None = None


class ChatCompletionChunk(_Answer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: None = None
    pasta: PastaStats | None = None


class Completion(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pasta"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorInfo
