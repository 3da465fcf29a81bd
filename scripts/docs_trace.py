"""The picture of a forked answer on the front page: the asynchronous decoder's own trace, step by step.

    python scripts/docs_trace.py            # rewrite the pictures in README.md and docs/lang.md
    python scripts/docs_trace.py --check    # exit 1 naming the stale files (tests/test_docs.py runs this check)

A short PASTA-LANG answer is replayed through the asynchronous decoder (`pasta.decoding`'s step loop, `StepBatch`, every
thread's tokens forced, nothing sampled) on the tiny random model, which shares the embedded SmolLM2 tokenizer:
the weights do not matter when the tokens are forced, the steps and the threads are the decoder's. Each line is one
forward step and shows the tokens each live thread wrote in it. The answer is written as training writes it by
default (uncounted promises). The trace sits between the markers `<!-- trace:begin -->` and `<!-- trace:end -->` of
each file; docs/lang.md also holds, between `<!-- drafted:begin -->` and `<!-- drafted:end -->`, the same trace with
the skeleton draft (`decode.draft_skeleton`), and between `<!-- layout:begin -->` and `<!-- layout:end -->`, what
`python -m pasta.lang explain` prints for the same answer.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

from pasta.errors import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
# (file, block): the trace goes on the front page and the language's page, the layout picture on the latter.
BLOCKS = ((ROOT / "README.md", "trace"), (ROOT / "docs" / "lang.md", "trace"), (ROOT / "docs" / "lang.md", "drafted"),
          (ROOT / "docs" / "lang.md", "layout"))
PROMPT = "Give two tips for sleeping better."
# The data's convention (the structural teacher's, rules-v3): the list's numbers stay in the main thread, each chunk
# writes only its item's body.
ANSWER = (
    "Two tips:\n"
    '1.<promise topic="routine"/>\n'
    '2.<promise topic="room"/>'
    '<async topic="routine"> Keep a fixed bedtime.</async>'
    '<async topic="room"> Keep the room dark and cool.</async>'
    "<sync/>\nBoth help."
)
COLUMN = 22
COMMAND = "python scripts/docs_trace.py"


def _show(tokenizer, token_id: int) -> str:
    """One token as the trace prints it: its text, a newline as `\\n`, a leading space as `␣`."""
    text = tokenizer.decode([token_id])
    text = text.replace("\n", "\\n")
    return "␣" + text[1:] if text.startswith(" ") else text


def _trace(model, tokenizer, doc, draft: bool) -> list[str]:
    """The step lines and the totals of `doc` replayed through the asynchronous decoder, every token forced; with
    `draft`, the skeleton draft's guesses fed as the decoder feeds them, each kept when it is the forced token (as
    `pasta.decoding.requests.choose_with_draft` keeps the ones the model chooses)."""
    from pasta.decoding import DecodeConfig
    from pasta.decoding.requests import new_request
    from pasta.decoding.runner import StepBatch, run_to_completion
    from pasta.decoding.text import pad_token_id
    from pasta.lang import MAIN_THREAD, ReservationPolicy, plain_text, tokenize_document
    from pasta.models import encode_prompt

    token_doc = tokenize_document(doc, tokenizer)
    streams = {MAIN_THREAD: list(token_doc.main_ids)}
    streams.update({k + 1: list(chunk.body_ids) for k, chunk in enumerate(token_doc.chunks)})
    written: dict[int, int] = dict.fromkeys(streams, 0)
    steps: list[dict[int, list[int]]] = []  # per step, the tokens each thread wrote in it

    def take(thread: int, step: dict[int, list[int]]) -> int:
        token_id = streams[thread][written[thread]]
        written[thread] += 1
        step.setdefault(thread, []).append(token_id)
        return token_id

    def force(logits, plan) -> list[int | None]:
        step: dict[int, list[int]] = {}
        chosen: list[int | None] = [None] * len(plan.sample_threads)
        main_rows = []
        for row, thread in enumerate(plan.sample_threads):
            if thread == MAIN_THREAD:
                main_rows.append(row)
            else:
                chosen[row] = take(thread, step)
        for k, row in enumerate(main_rows):  # the main thread's own row, then one per guess
            if not interpreter.main_samples:
                break
            token_id = take(MAIN_THREAD, step)
            if k < len(plan.draft_ids) and token_id == plan.draft_ids[k] and interpreter.keep_drafted(token_id):
                continue
            chosen[row] = token_id
            break
        steps.append(step)
        return chosen

    longest = max(len(chunk.body_ids) for chunk in token_doc.chunks)
    config = DecodeConfig(max_new_tokens=len(token_doc.main_ids), max_total_tokens=token_doc.num_tokens,
                          max_threads=len(token_doc.chunks), max_chunk_tokens=longest, draft_skeleton=draft)
    interpreter = new_request("async", model, tokenizer, encode_prompt(tokenizer, PROMPT), config, ReservationPolicy())
    with StepBatch(model, pad_token_id(tokenizer)) as batch:
        run_to_completion(batch, [(interpreter, force)], capacity=256)
    assert interpreter.text() == plain_text(doc), (interpreter.text(), plain_text(doc))

    topics = [promise.topic for promise in doc.promises]
    names = ["main thread"] + [f'chunk {k + 1} "{topic}"' for k, topic in enumerate(topics)]
    threads = [MAIN_THREAD] + [k + 1 for k in range(len(topics))]
    rows = [[" ".join(_show(tokenizer, t) for t in step.get(thread, [])) for thread in threads] for step in steps]
    widths = [max(COLUMN, len(name) + 2, *(len(row[c]) + 2 for row in rows)) for c, name in enumerate(names)]
    lines = ["step  " + "".join(name.ljust(width) for name, width in zip(names, widths, strict=True)).rstrip()]
    for number, row in enumerate(rows, start=1):
        lines.append(f"{number:>4}  " + "".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    num_tokens = sum(len(tokens) for step in steps for tokens in step.values())
    kept = f", {interpreter.num_draft_kept} of {interpreter.num_drafted} guesses kept" if draft else ""
    return lines + [
        "",
        f"{num_tokens} tokens in {len(steps)} forward steps: theoretical speedup {num_tokens / len(steps):.2f}x "
        f"(the decoder's own count: {interpreter.num_sampled} tokens, {interpreter.num_steps} steps{kept})",
    ]


def pictures() -> dict[str, list[str]]:
    """{"trace": the trace of ANSWER in the form training writes by default (the uncounted promises of the default
    reservation policy) replayed through the asynchronous decoder on the tiny model, "drafted": the same with the
    skeleton draft, "layout": what `python -m pasta.lang explain` prints for ANSWER}."""
    import torch

    from pasta.config import compose
    from pasta.lang import ReservationPolicy, add_tag_tokens, parse, plain_text, serialize, written_counts
    from pasta.lang.__main__ import explain, print_explanation
    from pasta.models import load_model

    torch.manual_seed(0)
    model, tokenizer = load_model(compose("generate", ["model=tiny"]).model, device="cpu")
    add_tag_tokens(tokenizer, model)
    doc = written_counts(parse(ANSWER), tokenizer, ReservationPolicy().counts)
    answer = [f"prompt: {PROMPT}", "answer (PASTA-LANG, as training writes it by default):"]
    answer += ["  " + line for line in serialize(doc).splitlines()]
    text = ["plain text: " + repr(plain_text(doc))]
    layout = io.StringIO()
    with contextlib.redirect_stdout(layout):
        print_explanation(explain(ANSWER, tokenizer))
    quoted = ANSWER.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")  # bash's $'...'
    explain_command = f"$ python -m pasta.lang explain $'{quoted}'"
    return {
        "trace": [*answer, "", *_trace(model, tokenizer, doc, draft=False), *text],
        "drafted": ["prompt and answer: as above, decode.draft_skeleton=true", "",
                    *_trace(model, tokenizer, doc, draft=True)],
        "layout": [explain_command, *layout.getvalue().rstrip().splitlines()],
    }


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def rewrite(text: str, name: str, lines: list[str], where: str) -> str:
    """`text` with its one `name` block replaced by `lines` in a fenced text block."""
    begin, end = markers(name)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"error: {where} must hold exactly one {begin} ... {end} block")
    return pattern.sub(lambda _: "\n".join([begin, "```text", *lines, "```", end]), text)


def stale_files(write: bool) -> list[str]:
    """The files whose pictures differ from a fresh trace (rewritten when `write`)."""
    blocks = pictures()
    texts = {path: path.read_text() for path, _ in BLOCKS}
    new_texts = dict(texts)
    for path, name in BLOCKS:
        new_texts[path] = rewrite(new_texts[path], name, blocks[name], str(path.relative_to(ROOT)))
    stale = [path for path in texts if new_texts[path] != texts[path]]
    if write:
        for path in stale:
            path.write_text(new_texts[path])
    return [str(path.relative_to(ROOT)) for path in stale]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    args = parser.parse_args(argv)
    stale = stale_files(write=not args.check)
    if args.check and stale:
        print(f"stale pictures in {', '.join(stale)}: run `{COMMAND}`", file=sys.stderr)
        return 1
    print(f"{'rewrote' if stale else 'up to date'}: {', '.join(stale) if stale else 'README.md, docs/lang.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
