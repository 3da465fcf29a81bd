"""PASTA-LANG: the annotation language, its tokens, its schedule and the parallel training layout.

Every stage imports the language from here; it knows nothing of any stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pasta.lang.repetition import Repetition, content_words, cross_thread_repetition
from pasta.lang.reservation import ReservationPolicy
from pasta.lang.syntax import (
    Document,
    LangError,
    Promise,
    Sync,
    Text,
    normalize_whitespace,
    parse,
    plain_text,
    serialize,
    strip_annotations,
    strip_tags,
    topic_words,
    validate_topic,
)
from pasta.lazy import lazy_exports

# The modules that hold tensors (the layout, its mask, the tokens and the schedule over them) are imported on first
# use: the syntax and the reservation policy are what a command's config check reads (pasta.lazy).
__getattr__ = lazy_exports(__name__, {
    "pasta.lang.layout": ("IGNORE_INDEX", "MAIN_THREAD", "PROMPT_THREAD", "Layout", "build_layout", "collate_layouts",
                          "num_layout_rows", "row_targets", "sequence_logprobs"),
    "pasta.lang.mask": ("additive_mask", "windowed_mask", "within_window"),
    "pasta.lang.schedule": ("Schedule", "schedule"),
    "pasta.lang.tokens": ("TAG_TOKENS", "TagIds", "TokenChunk", "TokenDoc", "add_tag_tokens", "drop_token_counts",
                          "encode_text", "fill_token_counts", "has_tag_tokens", "tokenize_document", "written_counts"),
}, globals())

if TYPE_CHECKING:
    from pasta.lang.layout import (
        IGNORE_INDEX,
        MAIN_THREAD,
        PROMPT_THREAD,
        Layout,
        build_layout,
        collate_layouts,
        num_layout_rows,
        row_targets,
        sequence_logprobs,
    )
    from pasta.lang.mask import additive_mask, windowed_mask, within_window
    from pasta.lang.schedule import Schedule, schedule
    from pasta.lang.tokens import (
        TAG_TOKENS,
        TagIds,
        TokenChunk,
        TokenDoc,
        add_tag_tokens,
        drop_token_counts,
        encode_text,
        fill_token_counts,
        has_tag_tokens,
        tokenize_document,
        written_counts,
    )

__all__ = [
    "IGNORE_INDEX",
    "MAIN_THREAD",
    "PROMPT_THREAD",
    "TAG_TOKENS",
    "Document",
    "LangError",
    "Layout",
    "Promise",
    "Repetition",
    "ReservationPolicy",
    "Schedule",
    "Sync",
    "TagIds",
    "Text",
    "TokenChunk",
    "TokenDoc",
    "add_tag_tokens",
    "additive_mask",
    "build_layout",
    "collate_layouts",
    "content_words",
    "cross_thread_repetition",
    "drop_token_counts",
    "encode_text",
    "fill_token_counts",
    "has_tag_tokens",
    "normalize_whitespace",
    "num_layout_rows",
    "parse",
    "plain_text",
    "row_targets",
    "schedule",
    "sequence_logprobs",
    "serialize",
    "strip_annotations",
    "strip_tags",
    "tokenize_document",
    "topic_words",
    "validate_topic",
    "windowed_mask",
    "within_window",
    "written_counts",
]
