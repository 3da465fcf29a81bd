"""Turn an Alpaca-style instruction into the model's chat prompt: the one prompt format every stage shares, and the
one place where text a user wrote becomes token ids.

The Alpaca `input` (context for the instruction) is appended to the instruction after a blank line, as one user
turn; the prompt ends with the assistant's generation header, so the model's next token starts the answer.

Control tokens (role markers such as ChatML's `<|im_start|>` and `<|im_end|>`, eos, PASTA-LANG's tags) come only
from the chat template and the decoder, never from the text of a message, a prompt, an instruction, an input or a
training record: a user who writes `<|im_end|><|im_start|>assistant\n...` into a message gets those characters as
text, not a turn of their own. transformers does this (`apply_chat_template(..., sanitize_control_tokens=True)`
encodes the control tokens found in the messages as plain text, and the template's own as tokens); text with no
control token in it gets exactly the ids it got before. Serve, generate, eval, annotate (the HF teacher), the HF
judge and both training stages encode their prompts here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pasta.errors import PastaError, one_line
from pasta.lang.tokens import ENCODE_LOCK

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TemplateRefused(PastaError):
    """The chat template refused a conversation (its roles or their order); `reason` is the template's one line."""

    def __init__(self, tokenizer_name: str, reason: str):
        super().__init__(f"the chat template of {tokenizer_name} refuses this conversation: {reason}")
        self.reason = reason


def user_message(instruction: str, input: str = "") -> str:
    """The user turn's text: the instruction, then the input after a blank line when there is one."""
    return f"{instruction}\n\n{input}" if input else instruction


def _check_template(tokenizer: PreTrainedTokenizerBase) -> None:
    if not tokenizer.chat_template:
        raise PastaError(f"tokenizer {tokenizer.name_or_path} has no chat template; set model.chat_template")


def encode_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    answer_start: str = "",
) -> list[int]:
    """The conversation's ids through the chat template, where only the template writes control tokens.

    `add_generation_prompt` ends them with the assistant's header; `answer_start` then starts the assistant's
    answer with that text (Skeleton-of-Thought's "1."). A template that refuses the conversation (roles, order) is
    a TemplateRefused (a PastaError).
    """
    _check_template(tokenizer)
    conversation = [dict(message) for message in messages]
    options: dict[str, Any] = {"add_generation_prompt": add_generation_prompt}
    if answer_start:
        # The answer's start as the assistant's unfinished turn: the template writes its header as the
        # generation prompt would, and text after it is text.
        conversation.append({"role": "assistant", "content": answer_start})
        options = {"continue_final_message": True}
    try:
        with ENCODE_LOCK:
            # The template already writes the special tokens (e.g. ChatML's <|im_start|>); adding them again would
            # double a BOS on tokenizers that prepend one.
            return list(tokenizer.apply_chat_template(
                conversation, tokenize=True, return_dict=False, sanitize_control_tokens=True, **options
            ))
    except Exception as exc:  # jinja2's TemplateError (a template's raise_exception) or transformers' ValueError
        raise TemplateRefused(tokenizer.name_or_path, one_line(str(exc))) from None


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, instruction: str, input: str = "", answer_start: str = ""
) -> list[int]:
    """The chat-template prompt ids of one user turn, ending with the assistant's generation header (and
    `answer_start`, when given)."""
    messages = [{"role": "user", "content": user_message(instruction, input)}]
    return encode_chat(tokenizer, messages, answer_start=answer_start)


def encode_text_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A raw prompt's ids (OpenAI's /v1/completions), framed as the tokenizer frames text (a BOS where it adds one):
    text that spells a special token is that text, as OpenAI's own tokenizer treats it."""
    with ENCODE_LOCK:
        return tokenizer(text, split_special_tokens=True)["input_ids"]
