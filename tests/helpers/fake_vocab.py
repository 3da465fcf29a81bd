"""A fake vocabulary for the decoder's model-free tests: ids 1..9 are words, 10..19 the digits 0..9, 90 eos,
100.. the PASTA-LANG tags (import as `from helpers.fake_vocab import TAGS, decode, promise`)."""

from __future__ import annotations

from pasta.lang import TagIds

TAGS = TagIds(promise=100, promise_tokens=101, promise_end=102, async_start=103, async_body=104, async_end=105,
              sync=106)
EOS = 90
WORDS = {1: "Tips", 2: " one", 3: " two", 4: ":", 5: " sleep", 6: " early", 7: " walk", 8: '"', 9: "\n",
         **{10 + d: str(d) for d in range(10)}}
P, PT, PE, AS, AB, AE, SY = 100, 101, 102, 103, 104, 105, 106


def decode(ids):
    return "".join(WORDS.get(i, "") for i in ids)


def promise(topic_ids, count):
    """A promise's tokens: <|promise|> topic <|promise_tokens|> digits <|promise_end|>."""
    return [P, *topic_ids, PT, *[10 + int(d) for d in str(count)], PE]
