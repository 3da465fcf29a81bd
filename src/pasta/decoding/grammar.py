"""Which next tokens keep PASTA-LANG well-formed, per thread state (`decode.constrain`): masks built once per tokenizer.

Unconstrained, the interpreter turns every malformed tag into text and counts it in `stats.malformed`. Constrained,
the sampler asks the interpreter for its thread's `Constraint` before taking a token: a list of rules, each the
malformed event it prevents (named as the interpreter counts it) and the [V] bool mask of the tokens that would
cause it. The rules, from `pasta.lang.syntax.parse`, the token grammar of `pasta.lang.tokens` and the interpreter's
fall-backs (`budget`: tags the main thread may still sample under `max_new_tokens` and what all threads together
have left of `max_total_tokens`, the free tags of `decode.free_tag_tokens` included):

    main, in text       <|async|> <|async_body|> <|async_end|> (the decoder supplies them)      async_tag_in_main
                        <|promise_tokens|> <|promise_end|> outside a promise                    stray_promise_tag
                        <|promise|> with budget < 3 (promise, topic, <|promise_end|>: it could   unclosed_promise
                        not close)
                        <|promise|> once the answer holds `max_promises` promises, or once one   promise_cap
                        topic extended an earlier one word by word (`stop_topic_loops`): a
                        runaway promise list, not malformed, but never an answer
    main, topic         eos, <|sync|> or a tag other than <|promise_tokens|> / <|promise_end|>   unclosed_promise
                        a token with `"`, `<`, `>`, a control character or no character; a      bad_topic
                        blank first token; one that takes the topic past `max_topic_chars`;
                        <|promise_tokens|> or <|promise_end|> after an empty or invalid topic
                        <|promise_tokens|> or <|promise_end|> after a topic this answer already  duplicate_topic
                        promised, in this list or an earlier one (the language forbids only a
                        list's exact repeat), or one with its words (`topic_words`: 'He wore'
                        after 'he wore'); a token that would complete such a topic where it
                        could no longer grow
                        a token that would repeat a pair of the topic's own words ('a plan and   topic_loop
                        a plan'): a topic looping inside itself, not malformed, but never a topic
                        a topic token with budget < 2, <|promise_tokens|> with budget < 3        unclosed_promise
    main, count         eos or a tag other than <|promise_end|>; a digit with budget < 2         unclosed_promise
                        a token that is not all ASCII digits; a leading 0; a digit past the      bad_count
                        interpreter's 8 count tokens; <|promise_end|> before a positive count
    chunk               eos                                                                      eos_in_chunk
                        any tag but <|async_end|>                                                tag_in_chunk
                        <|async_end|> before any visible text; a blank token when only one       empty_chunk
                        token is left before the closing one
                        anything but <|async_end|> on the chunk's last token (max_chunk_tokens)  chunk_cap

The count is optional: `<|promise_end|>` right after the topic closes an uncounted promise (the form a student
trained with `lang.reservation.policy=uncounted` writes), after the count a counted one.

Every state leaves at least one token: eos or text in the main thread's text, a topic token or
<|promise_end|> (the budget rules close a promise in time, and a topic cannot be a duplicate where it cannot
grow), a digit or <|promise_end|>, text or <|async_end|> in a chunk (with max_chunk_tokens = 1 a chunk can only be
empty, so there <|async_end|> is allowed and the interpreter counts the empty chunk). A `max_total_tokens` cut
stops every thread where it stands (chunks spend that budget in the same steps), so it can still leave a promise
open, as it can stop a chunk mid-sentence; for the same reason a budget rule yields where the promise could not
close yet (a topic or count token stays legal with no budget left: the cut comes first).

Token-level checks read each token's own text (`tokenizer.batch_decode` once per vocabulary): `"`, `<`, `>` and
control characters are single bytes, so no merge across tokens makes or hides them, and the sum of a topic's token
lengths bounds its decoded length (bytes of one character split over tokens decode to one character together).
"""

from __future__ import annotations

import bisect
import functools
import re
import weakref
from dataclasses import dataclass

import torch

from pasta.decoding.parser import MAX_COUNT_TOKENS
from pasta.lang import TagIds, encode_text
from pasta.lang.syntax import MAX_TOPIC_CHARS, num_tokens_value, topic_words, validate_topic

_BAD_TOPIC_CHAR = re.compile(r'["<>\x00-\x1f]')  # what a topic may not hold: quotes, angle brackets, controls

PROMISE_MIN_TOKENS = 3  # <|promise|> topic <|promise_end|>, the uncounted form


@functools.cache  # called per vocabulary token and per topic step, on a few hundred distinct characters
def _in_word(char: str) -> bool:
    """`char` (one character, or none) is part of a word as `topic_words` reads words: the one definition of a word
    that the duplicate and loop rules share with the evaluation's topic-loop count."""
    return bool(topic_words(char))


@dataclass(frozen=True)
class Rule:
    """The tokens that would cause one kind of malformed event."""

    kind: str
    forbidden: torch.Tensor  # [V] bool


@dataclass(frozen=True)
class Constraint:
    """A thread's legal next tokens and the rules that forbid the others."""

    rules: tuple[Rule, ...]
    allowed: torch.Tensor  # [V] bool

    @classmethod
    def of(cls, *rules: Rule) -> Constraint:
        forbidden = torch.zeros_like(rules[0].forbidden)
        for rule in rules:
            forbidden |= rule.forbidden
        return cls(rules, ~forbidden)

    @functools.cached_property
    def forced(self) -> bool:
        """Only one token is legal: a structured-generation engine would feed it without a forward (jump-forward)."""
        return int(self.allowed.sum()) == 1

    def violation(self, token_id: int) -> str:
        """The kind of the first rule that forbids `token_id` (a token `allowed` excludes)."""
        return next(rule.kind for rule in self.rules if bool(rule.forbidden[token_id]))


class Grammar:
    """Token classes of one vocabulary and the constraints of each thread state."""

    def __init__(self, token_texts: list[str], tag_ids: TagIds, eos_ids: set[int], num_logits: int,
                 device: torch.device | str):
        self.device = device
        texts = token_texts[:num_logits] + [""] * (num_logits - len(token_texts))  # rows past the vocabulary
        self.token_texts = texts
        self.num_chars = [len(text) for text in texts]
        self._num_chars = torch.tensor(self.num_chars, device=device)  # [V]
        self._ids_by_num_chars = sorted(range(len(texts)), key=self.num_chars.__getitem__)
        self._num_chars_ascending = [self.num_chars[i] for i in self._ids_by_num_chars]
        self._ids_by_text: dict[str, list[int]] = {}
        for token_id, text in enumerate(texts):
            self._ids_by_text.setdefault(text, []).append(token_id)

        def mask(flags) -> torch.Tensor:
            return torch.tensor(flags, dtype=torch.bool, device=device)

        tags = self.tags = tag_ids
        tag_mask = self._ids_mask(tags.all)
        eos = self._ids_mask(eos_ids)
        self._bad_topic_token = mask([not text or _BAD_TOPIC_CHAR.search(text) is not None for text in texts])
        self._blank = mask([not text.strip() for text in texts])
        self._digit_ids = [i for i, text in enumerate(texts) if text.isascii() and text.isdigit()]
        self._digit = self._ids_mask(self._digit_ids)
        self._leading_zero = self._digit & mask([text.startswith("0") for text in texts])
        self._text = ~tag_mask & ~eos  # tokens that are neither a tag nor eos
        self._not_text = set(tags.all) | set(eos_ids)
        # Text tokens by their first word (lowercased), apart by whether it starts the token ([True]: it would go on
        # with a word the topic ends in) or follows a space or a sign ([False]: a new word).
        self._ids_by_first_word: dict[bool, dict[str, list[int]]] = {True: {}, False: {}}
        for token_id, text in enumerate(texts):
            first = topic_words(text)[:1]
            if first and token_id not in self._not_text:
                starts_word = _in_word(text[:1])
                self._ids_by_first_word[starts_word].setdefault(first[0], []).append(token_id)

        self._in_topic_escape = Rule("unclosed_promise", eos | (tag_mask & ~self._ids_mask(
            [tags.promise_tokens, tags.promise_end])))
        self._count_escape = Rule("unclosed_promise", eos | (tag_mask & ~self._ids_mask([tags.promise_end])))
        async_tags = Rule("async_tag_in_main", self._ids_mask([tags.async_start, tags.async_body, tags.async_end]))
        stray = Rule("stray_promise_tag", self._ids_mask([tags.promise_tokens, tags.promise_end]))
        self._main_text = Constraint.of(async_tags, stray)
        self._main_text_short = Constraint.of(async_tags, stray,
                                              Rule("unclosed_promise", self._ids_mask([tags.promise])))
        self._main_text_capped = Constraint.of(async_tags, stray, Rule("promise_cap", self._ids_mask([tags.promise])))
        close = self._ids_mask([tags.async_end])
        chunk_rules = (Rule("tag_in_chunk", tag_mask & ~close), Rule("eos_in_chunk", eos))
        self._chunk = Constraint.of(*chunk_rules)
        self._chunk_empty = Constraint.of(*chunk_rules, Rule("empty_chunk", close))
        self._chunk_empty_last_text = Constraint.of(*chunk_rules, Rule("empty_chunk", close | self._blank))
        self._chunk_last = Constraint.of(Rule("chunk_cap", ~close))

    def _ids_mask(self, ids) -> torch.Tensor:
        flags = torch.zeros(len(self.num_chars), dtype=torch.bool, device=self.device)
        flags[list(ids)] = True
        return flags

    def main_text(self, budget: int, can_promise: bool = True) -> Constraint:
        if not can_promise:
            return self._main_text_capped
        return self._main_text if budget >= PROMISE_MIN_TOKENS else self._main_text_short

    def topic(self, topic_ids: list[int], topic: str, promised: set[str], budget: int,
              max_chars: int = MAX_TOPIC_CHARS) -> Constraint:
        """In a promise's topic: `topic` is `topic_ids` decoded; `promised` the topics the answer promised before
        (every list's: a list that repeats an earlier list's topic is the evaluation's topic loop too);
        `max_chars` the longest topic allowed (at most the language's MAX_TOPIC_CHARS)."""
        tags = self.tags
        num_chars = sum(self.num_chars[i] for i in topic_ids)
        too_long = self._num_chars > min(max_chars, MAX_TOPIC_CHARS) - num_chars
        bad = self._bad_topic_token | too_long | (self._blank if not topic_ids else torch.zeros_like(too_long))
        rules = [self._in_topic_escape, Rule("bad_topic", bad & self._text)]
        words = topic_words(topic)
        named = {topic_words(other) for other in promised} - {()}
        closing_kind = ("bad_topic" if not topic_ids or validate_topic(topic) else
                        "duplicate_topic" if topic in promised or words in named else None)
        if closing_kind:
            rules.append(Rule(closing_kind, self._ids_mask([tags.promise_tokens, tags.promise_end])))
        if budget < 3:  # <|promise_tokens|> digit <|promise_end|> would not fit
            rules.append(Rule("unclosed_promise", self._ids_mask([tags.promise_tokens])))
        # A topic token and <|promise_end|> would not fit. Where the topic cannot close yet, its token is the only
        # way on: the promise opened with room to close, and the chunks spent the shared budget in the same steps;
        # max_total_tokens then cuts the promise (Interpreter._stop_all), where no legal token would fail the decode.
        if budget < 2 and not closing_kind:
            rules.append(Rule("unclosed_promise", self._text))
        # A token that completes a promised topic is fine while the topic can still grow past it; where it could
        # not (no budget, or no characters left), a closing tag would be the only way on, and it is forbidden.
        stuck = [
            token_id
            for other in promised
            if other.startswith(topic) and (budget <= 2 or len(other) >= min(max_chars, MAX_TOPIC_CHARS))
            for token_id in self._ids_by_text.get(other[len(topic) :], [])
        ]
        stuck += self._completing_named(topic, words, num_chars, named, budget, min(max_chars, MAX_TOPIC_CHARS))
        if stuck:
            rules.append(Rule("duplicate_topic", self._ids_mask(stuck)))
        looping = self._repeating_a_pair(topic, words)
        if looping:
            rules.append(Rule("topic_loop", self._ids_mask(looping)))
        return Constraint.of(*rules)

    def _repeating_a_pair(self, topic: str, words: tuple[str, ...]) -> list[int]:
        """Tokens whose first word would make the topic repeat a pair of its own words ('a timeline and a budget
        and a timeline', 'markdown syntax: use markdown syntax'): a topic that loops inside itself. Only a token's
        first word is read (a token rarely holds two), so the rule never has to forbid a closing tag: no state it
        leads to holds a repeated pair that closing would keep."""
        pairs = list(zip(words, words[1:], strict=False))
        if not pairs:
            return []
        in_word = _in_word(topic[-1:])
        looping = []
        if in_word:  # a token that goes on with the last word changes the pair that word is in
            before, last = words[-2], words[-1]
            looping += [token_id for first, second in pairs[:-1]
                        if first == before and len(second) > len(last) and second.startswith(last)
                        for token_id in self._ids_by_first_word[True].get(second[len(last) :], [])]
        # A token that starts a new word pairs it with the last one.
        starting = [self._ids_by_first_word[False]] + ([] if in_word else [self._ids_by_first_word[True]])
        looping += [token_id for first, second in pairs if first == words[-1]
                    for ids in starting for token_id in ids.get(second, [])]
        return looping

    def _completing_named(self, topic: str, words: tuple[str, ...], num_chars: int, named: set[tuple[str, ...]],
                          budget: int, max_chars: int) -> list[int]:
        """Tokens that would turn `topic` into one with the words of a promised topic (`named`) where it could not
        grow past them: no budget for another topic token, or no characters left. With one character left a letter
        still changes the last word, so only those two cases trap a topic."""
        # Every word of the topic but its last, which the next token may extend, must open a promised topic's words.
        head = words[:-1] if _in_word(topic[-1:]) else words
        if not any(other[: len(head)] == head for other in named):
            return []
        if budget <= 2:
            candidates = range(len(self.num_chars))
        else:  # only tokens that reach the character limit leave no room after them
            first = bisect.bisect_left(self._num_chars_ascending, max_chars - num_chars)
            candidates = self._ids_by_num_chars[first:]
        return [i for i in candidates
                if i not in self._not_text and topic_words(topic + self.token_texts[i]) in named]

    def count(self, count_ids: list[int], count: str, budget: int, max_count: int | None = None) -> Constraint:
        """In a promise's count: `count` is `count_ids` decoded; `max_count` the largest count a chunk can fill
        (max_chunk_tokens: a larger one reserves positions no chunk writes, and moves the main thread past them)."""
        rules = [self._count_escape, Rule("bad_count", self._text & ~self._digit)]
        if max_count is not None and max_count >= 1:  # a digit only ever raises the count: a prefix check is exact
            over = [i for i in self._digit_ids if int(count.strip() + self.token_texts[i]) > max_count]
            if over:
                rules.append(Rule("bad_count", self._ids_mask(over)))
        if not count_ids:
            rules.append(Rule("bad_count", self._leading_zero))
        if len(count_ids) >= MAX_COUNT_TOKENS:
            rules.append(Rule("bad_count", self._digit))
        closes = num_tokens_value(count.strip()) is not None
        if budget < 2 and closes:  # as in a topic: a count that cannot close yet needs its digit, whatever the budget
            rules.append(Rule("unclosed_promise", self._digit))
        if not closes:
            rules.append(Rule("bad_count", self._ids_mask([self.tags.promise_end])))
        return Constraint.of(*rules)

    def chunk(self, has_text: bool, num_left: int) -> Constraint:
        """In a chunk that has written visible text or not, with `num_left` tokens before max_chunk_tokens."""
        if num_left <= 1:
            return self._chunk_last
        if has_text:
            return self._chunk
        return self._chunk_empty_last_text if num_left == 2 else self._chunk_empty


_GRAMMARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grammar_for(tokenizer, tag_ids: TagIds, eos_ids: set[int], num_logits: int,
                device: torch.device | str) -> Grammar:
    """The grammar of `tokenizer` for logits of width `num_logits`, built once per vocabulary, eos ids and device:
    per tokenizer object, and per vocabulary's token texts for a tokenizer loaded again (each preference round loads
    its policy's)."""
    key = (len(tokenizer), tag_ids, frozenset(eos_ids), num_logits, str(device))
    built = _GRAMMARS.setdefault(tokenizer, {})
    if key not in built:
        # Each token's text as the interpreter decodes it (pasta.decoding.text.text_decoder: special tokens dropped),
        # read after an anchor token: a SentencePiece vocabulary drops the leading space of a token that stands alone.
        anchor = encode_text(tokenizer, "a")[:1]
        prefix = len(tokenizer.decode(anchor, skip_special_tokens=True, clean_up_tokenization_spaces=False))
        texts = [text[prefix:] for text in _decode_each(tokenizer, [[*anchor, i] for i in range(len(tokenizer))])]
        built[key] = _grammar(tuple(texts), *key[1:])
    return built[key]


@functools.lru_cache(maxsize=4)
def _grammar(token_texts: tuple[str, ...], tag_ids: TagIds, eos_ids: frozenset[int], num_logits: int,
             device: str) -> Grammar:
    return Grammar(list(token_texts), tag_ids, set(eos_ids), num_logits, device)


def _decode_each(tokenizer, sequences: list[list[int]]) -> list[str]:
    """`tokenizer.batch_decode(sequences, skip_special_tokens=True, clean_up_tokenization_spaces=False)`."""
    from transformers import TokenizersBackend

    # batch_decode makes a Python call per sequence, the whole vocabulary's worth on every decoder start; a
    # tokenizer whose decode is the Rust tokenizer's, with nothing cleaned up, gives the same texts from one call.
    if all(getattr(type(tokenizer), name) is getattr(TokenizersBackend, name)
           for name in ("batch_decode", "decode", "_decode")):
        return tokenizer.backend_tokenizer.decode_batch(sequences, skip_special_tokens=True)
    return tokenizer.batch_decode(sequences, skip_special_tokens=True, clean_up_tokenization_spaces=False)
