"""scripts/skeleton_draft.py: saved answers replayed as the scheduler steps them, with and without a draft of the
promise list's skeleton."""

from __future__ import annotations

import json

import pytest

from helpers.decoding import prompt
from helpers.models import lively_model
from helpers.scripts import load_script
from pasta.config import compose
from pasta.decoding import teacher_forced_logprobs
from pasta.decoding.draft import SkeletonDraft
from pasta.decoding.text import text_decoder
from pasta.errors import PastaError
from pasta.lang import (
    ReservationPolicy,
    TagIds,
    add_tag_tokens,
    encode_text,
    parse,
    schedule,
    tokenize_document,
)
from pasta.models.loading import load_tokenizer

LIST = ('Tips:\n1.<promise topic="Sleep"/>\n2.<promise topic="Eat"/>\n3.<promise topic="Move"/>'
        '<async topic="Sleep"> Sleep well at night.</async><async topic="Eat"> Eat well.</async>'
        '<async topic="Move"> Move more.</async>')
SYNCED = ('Plan:<promise topic="Why"/><promise topic="How"/><async topic="Why"> Because it helps a lot.</async>'
          '<async topic="How"> Slowly.</async><sync/>So do both.')


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The tiny model's tokenizer with the tag tokens, saved as a model folder is."""
    tokenizer = load_tokenizer(compose("generate", ["model=tiny"]).model)
    add_tag_tokens(tokenizer)
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def script():
    return load_script("skeleton_draft")


def tokenizer_and_tags(script, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tokenizer, TagIds.from_tokenizer(tokenizer)


def test_replayed_as_decoded_an_answer_takes_the_decoders_own_steps_and_rows(script, tiny_model_and_tokenizer):
    model, tokenizer = lively_model(tiny_model_and_tokenizer[1])
    prompt_ids = prompt(tokenizer, "Give tips.")
    for text in (LIST, SYNCED):
        doc = tokenize_document(parse(text), tokenizer)
        _, stats = teacher_forced_logprobs(model, tokenizer, prompt_ids, doc, ReservationPolicy())
        replayed = script.replay(doc, len(prompt_ids), None, max_threads=len(doc.chunks))
        assert (replayed.num_steps, replayed.step_rows) == (stats.num_steps, stats.step_rows)
        assert replayed.num_steps == schedule(doc).num_steps
        assert replayed.num_main_steps == len(doc.main_ids)  # one token a step: nothing drafted


def test_the_replay_knows_when_the_main_thread_is_inside_a_topic(script, tokenizer_dir):
    tokenizer, tags = tokenizer_and_tags(script, tokenizer_dir)
    main_ids = tokenize_document(parse(LIST), tokenizer).main_ids
    after_eat = main_ids.index(tags.promise_end, main_ids.index(tags.promise_end) + 1)  # the second promise's end
    # The replay reads where the main thread stands from its tokens, as the decoder's parser does.
    assert script.in_topic(main_ids[:after_eat], tags) and not script.in_topic(main_ids[: after_eat + 1], tags)
    first = main_ids.index(tags.promise)
    assert not script.in_topic(main_ids[: first + 1], tags) and script.in_topic(main_ids[: first + 2], tags)
    assert not script.in_topic(main_ids[:first], tags)


def test_a_drafted_list_takes_the_steps_its_taken_tokens_save_and_a_row_cap_cuts_the_draft(script, tokenizer_dir):
    tokenizer, tags = tokenizer_and_tags(script, tokenizer_dir)
    doc = tokenize_document(parse(LIST), tokenizer)
    draft = SkeletonDraft(tags, text_decoder(tokenizer), lambda text: encode_text(tokenizer, text))
    plain = script.replay(doc, 7, None, max_threads=8)
    drafted = script.replay(doc, 7, draft, max_threads=8)
    marker = len(tokenizer("\n3.", add_special_tokens=False)["input_ids"])
    # Sleep's end; Eat's end with the whole next marker and <|promise|>; Move's end (the next marker is not there).
    assert drafted.num_accepted == 1 + (1 + marker + 1) + 1
    assert drafted.num_main_steps == plain.num_main_steps - drafted.num_accepted
    assert drafted.num_steps < plain.num_steps
    # Every token is fed once, as a draft row or as the next step's pending one; rejected draft rows come on top.
    assert sum(drafted.step_rows) - sum(plain.step_rows) == drafted.num_draft_rows - drafted.num_accepted
    # A cap of one row a step leaves no room for a draft; two rows, one draft token where the main thread is alone.
    assert script.replay(doc, 7, draft, max_threads=8, max_rows=1) == plain
    capped = script.replay(doc, 7, draft, max_threads=8, max_rows=2)
    assert 0 < capped.num_draft_rows < drafted.num_draft_rows
    assert plain.num_steps > capped.num_steps >= drafted.num_steps


def write_run(folder, records, model=None):
    folder.mkdir()
    (folder / "stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "run.json").write_text(json.dumps({"model": str(model), "decoding": {"max_threads": 8}}))


def test_the_script_prints_the_replay_beside_the_draft_and_refuses_a_folder_without_stats(script, tokenizer_dir,
                                                                                          tmp_path, capsys):
    answers = [{"instruction": "tips", "annotated": LIST, "finish_reason": "eos", "step_rows": [7]},
               {"instruction": "plan", "annotated": "Just text.", "finish_reason": "eos", "step_rows": [5]}]
    write_run(tmp_path / "run", answers, tokenizer_dir)
    write_run(tmp_path / "baseline", [{"instruction": "tips", "num_steps": 40, "step_rows": [7] + [1] * 39},
                                      {"instruction": "plan", "num_steps": 6, "step_rows": [5] + [1] * 5}])
    assert script.main([str(tmp_path / "run"), "--reference", str(tmp_path / "baseline")]) == 0
    out = capsys.readouterr().out
    assert "2 answers" in out
    replayed, drafted = (next(line for line in out.splitlines() if line.startswith(f"| {name} |"))
                         for name in ("as decoded (replayed)", "skeleton draft"))
    assert replayed.split("|")[2].strip() == drafted.split("|")[2].strip() == "1"  # forked answers
    assert float(drafted.split("|")[6]) > float(replayed.split("|")[6])  # step speedup
    (tmp_path / "empty").mkdir()
    with pytest.raises(PastaError, match="stats.jsonl"):
        script.main([str(tmp_path / "empty"), "--reference", str(tmp_path / "baseline")])
    # A reference whose records lack the steps an evaluation records: a PastaError (one line), no traceback.
    write_run(tmp_path / "other", [{"instruction": "tips"}, {"instruction": "plan"}])
    with pytest.raises(PastaError, match="num_steps"):
        script.main([str(tmp_path / "run"), "--reference", str(tmp_path / "other")])
