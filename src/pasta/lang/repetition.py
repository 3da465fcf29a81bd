"""Cross-thread repetition: how much of what a chunk writes is also written by another thread of the same answer.

A chunk is written without seeing its siblings, and sees the main thread only up to its promise. What it repeats
of another thread is either text the main thread already holds (its intro, the item's lead, the topic) or text a
sibling writes too, both wasted steps and, in a student's answers, the sign of chunks that guess what the others
say. The measure, per answer:

    share = content words of the chunks that also occur in another thread / content words of the chunks

where a chunk's content words are its word tokens (lower-cased, at least three letters, not numbers, not English
function words), each occurrence counted, and "another thread" is the main thread (its text and its topics: both
are what the main thread writes) or any other chunk of the answer. An answer without chunks has no share (None).
Evaluation (the structure table), the annotation summary and the study all read it from here.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from pasta.lang.syntax import Document, Text

_WORD = re.compile(r"[^\W\d_]{3,}")
# English function words and fillers: their reuse across threads says nothing about repeated content.
STOPWORDS = frozenset(["about", "above", "after", "again", "against", "all", "also", "although", "among", "and", "any", "are", "around", "because", "been", "before", "being", "below", "between", "both", "but", "can", "cannot", "could", "did", "does", "doing", "down", "during", "each", "either", "else", "even", "ever", "every", "few", "for", "from", "further", "had", "has", "have", "having", "her", "here", "hers", "herself", "him", "himself", "his", "how", "however", "into", "its", "itself", "just", "least", "less", "let", "like", "made", "make", "many", "may", "might", "more", "most", "much", "must", "myself", "near", "need", "neither", "nor", "not", "now", "off", "often", "once", "one", "only", "other", "others", "otherwise", "our", "ours", "ourselves", "out", "over", "own", "per", "perhaps", "quite", "rather", "same", "several", "shall", "she", "should", "since", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "therefore", "these", "they", "this", "those", "though", "through", "thus", "too", "toward", "towards", "under", "until", "upon", "use", "used", "uses", "using", "very", "was", "way", "ways", "well", "were", "what", "whatever", "when", "where", "whether", "which", "while", "who", "whom", "whose", "why", "will", "with", "within", "without", "would", "yet", "you", "your", "yours", "yourself", "yourselves", "get", "gets", "getting", "got", "ones", "two", "three", "first", "second", "another", "etc"])


def content_words(text: str) -> list[str]:
    """The text's content words, lower-cased, in order (see the module docstring)."""
    return [w for w in (m.group().lower() for m in _WORD.finditer(text)) if w not in STOPWORDS]


@dataclass(frozen=True)
class Repetition:
    """One answer's cross-thread repetition: its chunks' content words, and how many another thread also writes."""

    num_chunk_words: int
    num_repeated_words: int

    @property
    def share(self) -> float | None:
        """Repeated / chunk content words; None for an answer whose chunks hold no content word (or no chunk)."""
        return self.num_repeated_words / self.num_chunk_words if self.num_chunk_words else None


def cross_thread_repetition(doc: Document) -> Repetition:
    """How many of the chunks' content words another thread of the same answer also writes."""
    main = Counter(w for item in doc.items if isinstance(item, Text) for w in content_words(item.text))
    main.update(w for promise in doc.promises for w in content_words(promise.topic))
    chunks = [Counter(content_words(promise.content)) for promise in doc.promises]
    in_chunks = Counter(w for words in chunks for w in words)  # how many chunks write each word
    num_words = num_repeated = 0
    for words in chunks:
        for word, count in words.items():
            num_words += count
            if main[word] or in_chunks[word] > 1:
                num_repeated += count
    return Repetition(num_words, num_repeated)
