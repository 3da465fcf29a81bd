"""The OpenAI API's request and response bodies that the server speaks (pydantic; FastAPI validates with them).

Requests accept OpenAI's field names; unknown fields are ignored as OpenAI's own server ignores fields it does
not know, but fields that would change the answer and that the decoder does not implement (logprobs, penalties,
tools) are refused with a 400 rather than silently dropped. `temperature`, `top_p`, `max_tokens` left out take
the server's decode config. Each choice carries a `pasta` object: the decoder's stats, and the annotated text
when the request sets `"pasta": {"annotated": true}` (the openai client: `extra_body={"pasta": {...}}`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class PastaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    annotated: bool = Field(default=False, description="add the annotated PASTA-LANG text to each choice")


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Generation(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    pasta: PastaOptions | None = None
    logprobs: bool | int | None = None
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
        if self.logprobs:
            return "logprobs"
        if self.presence_penalty:
            return "presence_penalty"
        if self.frequency_penalty:
            return "frequency_penalty"
        return None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict] | None = None

    def unsupported(self) -> str | None:
        return "tools" if self.tools else super().unsupported()


class CompletionRequest(_Generation):
    prompt: str = Field(min_length=1)
    echo: bool = False

    def unsupported(self) -> str | None:
        return "echo" if self.echo else super().unsupported()


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
