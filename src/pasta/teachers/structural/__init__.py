"""The `structural` teacher: rule-based PASTA-LANG annotation that needs no model.

It is the offline fallback and the heuristic baseline, in the spirit of Skeleton-of-Thought and APAR: the parallel
parts of an answer are found from its layout, not its meaning. What the main thread writes is the skeleton: list
markers and numbers, bold or labelled leads, headings and point openers stay in it, and each chunk writes only its
body (`leads`), under a short topic (the lead's first word, more only to tell two apart; or the body's first
words). So a chunk never guesses its item number and never writes its lead a second time.

- **Lists**: numbered (`1.`, `2)`) or bulleted (`-`, `*`, `•`, `+`) items at one indentation, with their indented
  continuation lines and sub-bullets, each item one chunk. Blank lines between items stay in the main text.
- **Labelled paragraphs**: consecutive paragraphs that each open with a label (`**Solids**`, `Solids:`, `## Solids`).
- **Sections**: runs of headings of one kind (`## Sleep`, a bold line, a short `Movies:` line) with what follows
  each, a list or several paragraphs (`sections`); an `Introduction` section stays before them, a `Summary` after.
  A run of sections competes with the lists inside it: the one with fewer estimated steps wins.
- **Groups** join across a heading line or a short `Label:` line (`**Cons:**`, `### Drawbacks`): the main thread
  writes it without waiting for the chunks before it.
- **Announced paragraphs**: paragraphs that follow an intro naming their number ("three states" and three
  paragraphs after it).
- **Pros and cons**: two lists separated only by a short heading (`Cons:`) form one group.
- **Runs of points inside a paragraph**: after an intro sentence, sentences that open with ordinals in order
  ("First, ... Second, ..."), with additive openers ("Additionally", "Furthermore", "Another ...") or as examples
  ("For example, ... Another example ..."), each point running to the next opener; "Finally" opens the last, and a
  sentence that sums up ("Overall", "These ...") ends the run. A point that opens by pointing back ("Second, this
  ..."), a sentence that reads as a next step ("Then", "Once ..."), or imperative points when the instruction did
  not ask for tips or ways ("First, preheat the oven") leave the paragraph sequential.

And what it leaves sequential, as the teacher prompt asks: short answers (`min_words`), instructions that ask for
steps, derivations, code or stories (`sequential_patterns`), lists whose items point back at earlier ones ("Then",
"the result", "on the other hand"), parts that the text around them calls steps (the paragraph that introduces
them, a heading above them, the answer's opening: "Here's a step-by-step guide", "Installation Steps:", a recipe;
or the sentence after: "These steps ..."), the numbered imperative items of an answer to "how do I install ...",
a list that opens with "1. Start ..." or ends on an item that introduces what follows ("Add these endings:"),
headings or labels that place parts in a sequence ("Step 2", "Day 1", "Chapter 3", "Morning:", "Ingredients"),
lists whose items are mostly too short to be worth a promise (median under `min_item_words`), parts whose labels
repeat (the turns of a dialogue), groups whose estimated critical path is not shorter than writing them in order,
and a last item or paragraph that sums up the others ("Overall, ..."), which goes after `<sync/>`. Any main text
after a group follows a `<sync/>`, since it may refer to the chunks.

The annotation is built from character spans of the response, so its plain text is the response exactly: this
teacher never changes a character. Topics are the lead's first `lead_topic_words` words, or the body's first `topic_words` words.

Modules, one job each:
    config      StructuralConfig, and the instructions that ask for sequential answers
    segments    the response cut into lines, paragraphs and sentences, as character spans
    cues        the phrases the rules read (ordinals, "Then", "Overall", "steps", ...)
    lists       numbered and bulleted lists and their items
    paragraphs  runs of labelled or announced paragraphs
    sentences   runs of points inside one paragraph
    leads       what of a part stays in the main thread (marker, number, lead, heading, opener)
    sections    runs of sections under headings
    topics      labels, and the topic of each promise
    rules       which parts are independent, which blocks join, whether a group saves steps
    annotator   StructuralAnnotator and StructuralTeacher: the pipeline, and the annotation it builds
"""

from pasta.teachers.structural.annotator import RULES_VERSION, StructuralAnnotator, StructuralTeacher
from pasta.teachers.structural.config import StructuralConfig
from pasta.teachers.structural.topics import label_of, make_topic

__all__ = ["RULES_VERSION", "StructuralAnnotator", "StructuralConfig", "StructuralTeacher", "label_of", "make_topic"]
