"""PASTA-LANG at the token level: the tag tokens, and a `Document` turned into the ids each thread samples.

Decision: the tag skeleton is seven added special tokens, and a response is tokenized structurally (each main-text
run, topic, count and chunk on its own, with `split_special_tokens=True`). So a tag is the same ids whether it sits
inside a whole response (training) or is fed alone by the decoder (the forced `<async topic=...>` opener): there is
no BPE merge across a tag boundary, and text that merely contains tag-like characters (`">` in HTML) never turns
into a tag token. The special-token strings are not the inline-form strings, so user text cannot contain them by
accident; the decoder renders the inline form from the ids.

    main thread:  <|promise|> topic <|promise_tokens|> N <|promise_end|>  ...  <|sync|>  ...  eos
                  (or, uncounted: <|promise|> topic <|promise_end|>)
    chunk thread: <|async|> topic <|async_body|> (decoder-supplied, not trained)  content <|async_end|> (trained)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields, replace

import torch

from pasta.lang.syntax import Document, LangError, Promise, Sync, Text

# transformers switches special-token splitting per call by setting a flag on the tokenizer object that all threads
# share: two threads encoding at once (the server tokenizes prompts on a thread pool while its engine thread runs)
# could each run with the other's setting. Every encoding that splits special tokens holds this lock
# (pasta.models.prompts too), so text never becomes a control token because another thread was encoding.
ENCODE_LOCK = threading.RLock()

# Special-token string -> the inline-form text whose sub-token embeddings initialise the new row.
TAG_TOKENS: dict[str, str] = {
    "<|promise|>": '<promise topic="',
    "<|promise_tokens|>": '" tokens="',
    "<|promise_end|>": '"/>',
    "<|async|>": '<async topic="',
    "<|async_body|>": '">',
    "<|async_end|>": "</async>",
    "<|sync|>": "<sync/>",
}


@dataclass(frozen=True)
class TagIds:
    """Token ids of the tag skeleton in one tokenizer."""

    promise: int
    promise_tokens: int
    promise_end: int
    async_start: int
    async_body: int
    async_end: int
    sync: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TagIds:
        ids = {}
        for f, token in zip(fields(cls), TAG_TOKENS, strict=True):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise LangError(
                    f"tokenizer has no PASTA-LANG token {token}: call pasta.lang.add_tag_tokens(tokenizer, model)"
                )
            ids[f.name] = token_id
        return cls(**ids)

    @property
    def all(self) -> frozenset[int]:
        return frozenset(getattr(self, f.name) for f in fields(self))


def has_tag_tokens(tokenizer) -> bool:
    vocab = tokenizer.get_vocab()
    return all(token in vocab for token in TAG_TOKENS)


def add_tag_tokens(tokenizer, model=None) -> TagIds:
    """Add the tag tokens to `tokenizer` (idempotent) and, given a model, grow its embeddings to match.

    New rows start at the mean embedding of the inline-form text they stand for (`<promise topic="` ...), which
    gives a pretrained model a sensible prior for tags it has never seen. Under LoRA, make these rows trainable
    (peft's `trainable_token_indices`), or the model cannot learn to emit them.
    """
    from transformers import AddedToken

    vocab = tokenizer.get_vocab()  # a copy of the whole vocabulary on each call: once, not once per tag
    missing = [token for token in TAG_TOKENS if token not in vocab]
    if missing:
        tokenizer.add_tokens(
            [AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True
        )
    tag_ids = TagIds.from_tokenizer(tokenizer)
    if model is not None:
        _grow_embeddings(model, tokenizer, tag_ids, added=bool(missing))
    return tag_ids


@torch.no_grad()
def _grow_embeddings(model, tokenizer, tag_ids: TagIds, added: bool) -> None:
    """Rows for the tags the model lacks, each started at its inline text's mean: the rows past the model's (a resize),
    and, for tags this call `added` to the tokenizer, rows the model already has: a padded vocabulary (Qwen2.5's
    151,936 rows for 151,665 tokens) holds the new ids in rows no token ever trained. Tags the tokenizer had (a
    PASTA checkpoint's) keep their trained rows."""
    num_rows = model.get_input_embeddings().weight.shape[0]
    needed = max(tag_ids.all) + 1
    if num_rows >= needed and not added:
        return
    if num_rows < needed:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    matrices = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight.data_ptr() != matrices[0].data_ptr():
        matrices.append(output.weight)
    for token, text in TAG_TOKENS.items():
        row = tokenizer.convert_tokens_to_ids(token)
        if row < num_rows and not added:
            continue
        source_ids = torch.tensor(encode_text(tokenizer, text))
        for weight in matrices:  # [V, D]
            weight[row] = weight[source_ids].mean(dim=0)


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of plain text: no BOS/EOS, and tag-like text never becomes a special token."""
    if not text:
        return []
    with ENCODE_LOCK:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


@dataclass(frozen=True)
class TokenChunk:
    """One asynchronous thread's tokens."""

    opener_ids: list[int]  # <|async|> topic <|async_body|>: supplied by the decoder, never trained
    body_ids: list[int]  # content then <|async_end|>: sampled by the thread and trained
    num_predicted: int | None  # the promise's tokens="N": the chunk length the main thread predicted; None uncounted


@dataclass(frozen=True)
class TokenDoc:
    """A response as the ids each thread samples.

    `main_ids` holds everything the main thread samples in order, tags included; its i-th `<|promise_end|>` forks
    `chunks[i]`. `<|sync|>` ids in `main_ids` are the joins; the end is an implicit join.
    """

    main_ids: list[int]
    chunks: list[TokenChunk]
    tag_ids: TagIds
    fork_indices: list[int] = field(init=False)  # index in main_ids of each <|promise_end|>

    def __post_init__(self) -> None:
        forks = [i for i, t in enumerate(self.main_ids) if t == self.tag_ids.promise_end]
        if len(forks) != len(self.chunks):
            raise LangError(f"{len(forks)} promises in the main thread but {len(self.chunks)} chunks")
        object.__setattr__(self, "fork_indices", forks)

    @property
    def num_tokens(self) -> int:
        """Tokens sampled by all threads (decoder-supplied openers are not sampled)."""
        return len(self.main_ids) + sum(len(c.body_ids) for c in self.chunks)


def tokenize_document(doc: Document, tokenizer, *, add_eos: bool = True) -> TokenDoc:
    """The ids each thread of `doc` samples. A promise without `tokens=` takes the uncounted form (see
    `fill_token_counts` and `drop_token_counts`)."""
    tag_ids = TagIds.from_tokenizer(tokenizer)
    main_ids: list[int] = []
    chunks: list[TokenChunk] = []
    for item in doc.items:
        if isinstance(item, Text):
            main_ids += encode_text(tokenizer, item.text)
        elif isinstance(item, Promise):
            topic_ids = encode_text(tokenizer, item.topic)
            main_ids += [tag_ids.promise, *topic_ids]
            if item.num_tokens is not None:
                main_ids += [tag_ids.promise_tokens, *encode_text(tokenizer, str(item.num_tokens))]
            main_ids.append(tag_ids.promise_end)
            chunks.append(
                TokenChunk(
                    opener_ids=[tag_ids.async_start, *topic_ids, tag_ids.async_body],
                    body_ids=[*encode_text(tokenizer, item.content), tag_ids.async_end],
                    num_predicted=item.num_tokens,
                )
            )
        elif isinstance(item, Sync):
            main_ids.append(tag_ids.sync)
    if add_eos:
        if tokenizer.eos_token_id is None:
            raise LangError("tokenizer has no eos token")
        main_ids.append(tokenizer.eos_token_id)
    return TokenDoc(main_ids=main_ids, chunks=chunks, tag_ids=tag_ids)


def drop_token_counts(doc: Document) -> Document:
    """Every promise without `tokens=` (the uncounted form, `ReservationPolicy(policy="uncounted")`)."""
    return Document(tuple(replace(item, num_tokens=None) if isinstance(item, Promise) else item
                          for item in doc.items))


def written_counts(doc: Document, tokenizer, counts: bool) -> Document:
    """The promises as training data writes them: counted in `tokenizer`'s tokens, or uncounted."""
    return fill_token_counts(doc, tokenizer) if counts else drop_token_counts(doc)


def fill_token_counts(doc: Document, tokenizer) -> Document:
    """Set every promise's `tokens=` to its chunk's length in tokens of `tokenizer` (teachers give only topics)."""
    return Document(
        tuple(
            replace(item, num_tokens=len(encode_text(tokenizer, item.content)))
            if isinstance(item, Promise)
            else item
            for item in doc.items
        )
    )
