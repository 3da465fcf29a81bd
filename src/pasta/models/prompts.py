"""Turn an Alpaca-style instruction into the model's chat prompt: the one prompt format every stage shares.

The Alpaca `input` (context for the instruction) is appended to the instruction after a blank line, as one user
turn; the prompt ends with the assistant's generation header, so the model's next token starts the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pasta.errors import PastaError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def user_message(instruction: str, input: str = "") -> str:
    """The user turn's text: the instruction, then the input after a blank line when there is one."""
    return f"{instruction}\n\n{input}" if input else instruction


def prompt_text(tokenizer: PreTrainedTokenizerBase, instruction: str, input: str = "") -> str:
    """The chat-template prompt as text, ending with the assistant's generation header."""
    if not tokenizer.chat_template:
        raise PastaError(f"tokenizer {tokenizer.name_or_path} has no chat template; set model.chat_template")
    messages = [{"role": "user", "content": user_message(instruction, input)}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, instruction: str, input: str = "") -> list[int]:
    """The chat-template prompt ids, ending with the assistant's generation header."""
    # The template already writes the special tokens (e.g. ChatML's <|im_start|>); adding them again would
    # double a BOS on tokenizers that prepend one.
    return tokenizer(prompt_text(tokenizer, instruction, input), add_special_tokens=False)["input_ids"]
