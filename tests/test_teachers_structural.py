"""The rule-based teacher: which layouts become chunks, which stay sequential, and that no character ever changes."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from pasta.config import compose
from pasta.lang import Promise, Sync, Text, parse, plain_text, validate_topic
from pasta.teachers import StructuralAnnotator, StructuralConfig, TeacherRequest, build_teacher
from pasta.teachers.structural import make_topic

ROOT = Path(__file__).resolve().parent.parent
RULES = StructuralAnnotator(StructuralConfig())

TIPS = (
    "A few settings make a big difference to battery life:\n\n"
    "1. Lower the screen brightness or turn on automatic brightness, since the display uses the most power.\n"
    "2. Turn off Bluetooth, Wi-Fi and location services when you are not using them at all.\n"
    "3. Close apps that refresh in the background, such as news and social media apps.\n\n"
    "With these changes, most phones last several hours longer on a single charge."
)


def doc_of(instruction: str, response: str):
    annotated = RULES.annotate(instruction, response)
    doc = parse(annotated)
    assert plain_text(doc) == response
    return doc


def test_numbered_tips_become_one_group_with_intro_before_and_conclusion_after_sync():
    doc = doc_of("How can I make my phone battery last longer?", TIPS)
    # The item numbers stay in the main thread, which renders the list; each chunk writes its item's body.
    assert [p.content[:7] for p in doc.promises] == [" Lower ", " Turn o", " Close "]
    assert isinstance(doc.items[0], Text) and doc.items[0].text.startswith("A few settings")
    assert [item.text for item in doc.items[2:5:2]] == ["\n2.", "\n3."] and doc.items[0].text.endswith(":\n\n1.")
    kinds = [type(item).__name__ for item in doc.items]
    assert kinds == ["Text", "Promise", "Text", "Promise", "Text", "Promise", "Sync", "Text"]
    assert doc.items[-1].text == "\n\nWith these changes, most phones last several hours longer on a single charge."
    assert [p.topic for p in doc.promises] == ["Lower the screen brightness", "Turn off Bluetooth", "Close apps that refresh"]


def test_pros_and_cons_lists_form_one_group():
    response = (
        "Working from home suits some people better than others, and it is worth weighing both sides.\n\n"
        "Pros:\n- No commute, which saves time and money every day.\n"
        "- More control over your schedule and your surroundings.\n\n"
        "Cons:\n- It is easy to feel isolated from your colleagues.\n"
        "- The line between work time and free time can blur."
    )
    doc = doc_of("What are the pros and cons of working from home?", response)
    # Two short items a side: a chunk per side is cheaper than a topic per item, and the sides' labels stay in
    # the main thread.
    assert len(doc.groups) == 1 and [p.topic for p in doc.promises] == ["Pros", "Cons"]
    assert not any(isinstance(item, Sync) for item in doc.items)
    assert [item.text for item in doc.items if isinstance(item, Text)][1] == "\n\nCons:"
    longer = response.replace("every day.", "every day, and the hours you win back add up to whole weeks a year.")
    longer = longer.replace("surroundings.", "surroundings, from the chair you sit on to the music in the room.")
    longer = longer.replace("colleagues.", "colleagues, who you may now see only on a video call once a week.")
    longer = longer.replace("can blur.", "can blur, so that the evening slowly fills with unanswered emails.")
    doc = doc_of("What are the pros and cons of working from home?", longer)
    assert len(doc.groups) == 1 and len(doc.promises) == 4  # long items: one chunk each, across the Cons: line
    assert "\n\nCons:\n-" in [item.text for item in doc.items if isinstance(item, Text)]


@pytest.mark.parametrize(
    "instruction",
    [
        "Describe the steps to change a tire.",
        "Give me a recipe for pancakes.",
        "Calculate the total cost.",
        "Write a short story about a dragon.",
        "Write a Python function that sorts a list.",
    ],
)
def test_instructions_asking_for_dependent_parts_get_no_tags(instruction):
    assert not doc_of(instruction, TIPS).is_annotated


def test_items_that_build_on_earlier_ones_stay_sequential():
    response = (
        "Here is how to reach the summit of the hill before the sun goes down tonight:\n\n"
        "1. Park at the north trailhead and follow the red markers up the valley.\n"
        "2. Then take the left fork after the wooden bridge over the stream.\n"
        "3. Finally climb the last steep section to the stone cairn at the top."
    )
    assert not doc_of("How do I get to the top of the hill?", response).is_annotated


def test_short_answers_and_short_items_get_no_tags():
    assert not doc_of("List three colors.", "1. Red\n2. Green\n3. Blue").is_annotated
    short_items = "Here are some fruits that you can buy at almost any market in the city center:\n" + "\n".join(
        f"- {fruit}" for fruit in ["Apples", "Pears", "Plums", "Grapes", "Figs", "Kiwis"]
    )
    assert not doc_of("Name some fruits.", short_items + " " + "and more " * 10).is_annotated


def test_a_summing_up_last_item_goes_after_sync():
    response = (
        "Street trees do much more than decorate a city, and planners value them for several reasons:\n\n"
        "1. They provide shade, which keeps pavements and buildings cooler in summer.\n"
        "2. Their roots and leaves absorb rainwater, reducing the risk of flooding.\n"
        "3. They filter dust and some pollutants from the air that people breathe.\n"
        "4. Overall, they make a neighborhood healthier and more pleasant to live in."
    )
    doc = doc_of("Why do cities plant trees?", response)
    assert len(doc.promises) == 3
    assert isinstance(doc.items[-2], Sync) and doc.items[-1].text.startswith("\n4. Overall")


def test_labelled_paragraphs_become_chunks_with_their_labels_as_topics():
    response = (
        "Matter on Earth is most often found in a few familiar states that we meet every day.\n\n"
        "**Solids** have a fixed shape and volume, because their particles only vibrate in place.\n\n"
        "**Liquids** have a fixed volume but take the shape of their container as they flow.\n\n"
        "**Gases** have neither a fixed shape nor a fixed volume and spread out to fill any space."
    )
    doc = doc_of("Describe the states of matter.", response)
    assert [p.topic for p in doc.promises] == ["Solids", "Liquids", "Gases"]


def test_paragraphs_announced_by_their_number_become_chunks():
    response = (
        "There are three popular ways to organize a monthly budget.\n\n"
        "The 50/30/20 rule splits income into needs, wants and savings in fixed shares.\n\n"
        "Zero-based budgeting gives every single dollar a job until nothing is left unplanned.\n\n"
        "The envelope system divides cash into envelopes for each category of spending."
    )
    assert len(doc_of("Explain some budgeting methods.", response).promises) == 3
    unannounced = response.replace("three popular", "some popular")
    assert not doc_of("Explain some budgeting methods.", unannounced).is_annotated


def test_code_blocks_are_never_split_or_tagged():
    response = (
        "Here is a small helper that you can reuse across your projects whenever you need it:\n\n"
        "```python\n- not a bullet, this is code that must stay exactly where it is in the file\n"
        "- another line of code that looks like a list item but is inside the fence\n```\n\n"
        "It returns the cleaned value and never raises on empty input."
    )
    doc = doc_of("Show me a helper.", response)
    assert not doc.is_annotated


def test_quiz_items_with_unindented_options_keep_their_options():
    questions = [
        ("What is the capital city of Germany today?", ["Berlin", "Paris", "Madrid"]),
        ("Which river runs through the city of London?", ["Seine", "Thames", "Danube"]),
        ("Which is the highest mountain range in Europe?", ["Alps", "Urals", "Andes"]),
    ]
    response = "\n\n".join(
        f"{n}. {q}\n" + "\n".join(f"{'ABC'[i]}) {o}" for i, o in enumerate(options))
        for n, (q, options) in enumerate(questions, start=1)
    )
    doc = doc_of("Create a geography quiz.", response)
    assert len(doc.promises) == 3
    assert all(p.content.endswith(("Madrid", "Danube", "Andes")) for p in doc.promises)


def test_topics_are_valid_unique_and_informative():
    assert make_topic("1. Retrieval practice: test yourself often", 5) == "Retrieval practice"
    assert make_topic("Q1: What is the capital of India?\nA. Delhi", 4) == "capital of India"
    assert make_topic('- "Buzz", the sound of a bee flying past the window', 4) == "Buzz the sound"
    assert make_topic("1. Ensure a fast response time to customer inquiries.", 4) == "Ensure a fast response"
    response = "Some good advice that people give again and again:\n\n" + "\n".join(
        f"- Drink water every day, item {n}, because it keeps you healthy and alert." for n in range(4)
    )
    topics = [p.topic for p in doc_of("Give advice.", response).promises]
    assert len(set(topics)) == len(topics) == 4
    assert all(validate_topic(t) is None for t in topics)


def test_the_embedded_sample_keeps_every_character_and_finds_its_lists():
    records = [json.loads(line) for line in (ROOT / "data" / "alpaca_sample.jsonl").read_text().splitlines()]
    annotated = 0
    for record in records:
        doc = doc_of(record["instruction"], record["output"])
        annotated += doc.is_annotated
        for promise in doc.promises:
            assert promise.content.rstrip() == promise.content and validate_topic(promise.topic) is None
            # An item's marker stays in the main thread (a section's chunk may hold a whole list below its heading).
            assert not re.match(r"[ \t]*(\d+[.)]|[-*•+])[ \t]", promise.content)
    # SAMPLE.md: 44 of the 80 responses are made of independent parts; the rules find most of them and
    # leave the sequential ones alone (steps, recipes, stories, derivations, code).
    assert 30 <= annotated <= 44
    by_instruction = {r["instruction"]: r for r in records}
    for sequential in ("How do I change a flat tire?", "Give me a recipe for simple homemade bread."):
        assert not doc_of(sequential, by_instruction[sequential]["output"]).is_annotated


def test_a_100kb_response_is_annotated_without_changing_it():
    item = "- Keep a notebook by the bed and write down every idea that comes to you at night.\n"
    response = "Ideas:\n" + item * (100_000 // len(item))
    doc = doc_of("Give me ideas.", response)
    assert len(doc.promises) == response.count("- Keep")
    assert len({p.topic for p in doc.promises}) == len(doc.promises)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(list("ab 1.-*:#`\n\t•)") + ["**", "1. ", "- ", "\n\n", "```\n", "Pros:", "three ", "word "]),
        max_size=200,
    ).map("".join),
    st.integers(1, 8),
)
def test_any_response_comes_back_character_for_character(response, min_words):
    rules = StructuralAnnotator(StructuralConfig(min_words=min_words, min_item_words=1))
    assert plain_text(parse(rules.annotate("List some things.", response))) == response


def test_structural_yaml_matches_the_dataclass_defaults():
    cfg = OmegaConf.to_container(compose("annotate", ["teacher=structural"]).teacher)
    assert cfg == dataclasses.asdict(StructuralConfig())


def test_teacher_interface_answers_in_request_order():
    teacher = build_teacher({"kind": "structural"})
    requests = [TeacherRequest(str(n), "List tips.", "", TIPS if n % 2 else "Short.") for n in range(5)]
    replies = list(teacher.annotate(iter(requests)))
    assert [r.id for r in replies] == [r.id for r in requests]
    assert all(r.error is None and r.reject_reason is None for r in replies)
    assert [parse(r.text).is_annotated for r in replies] == [False, True, False, True, False]
    assert teacher.model == "rules-v4"


def test_two_lists_of_custom_patterns_name_two_teachers():
    """An output is extended only by the teacher that wrote it: its name holds every setting off the defaults."""
    names = [build_teacher({"kind": "structural", "sequential_patterns": [pattern], "topic_words": 1}).model
             for pattern in (r"\brecipe\b", r"\bstory\b")]
    assert names[0] != names[1] and all(re.fullmatch(r"rules-v4 topic_words=1 sequential_patterns=custom-[0-9a-f]{8}",
                                                     name) for name in names)


def test_unknown_teacher_key_is_a_one_line_error():
    from pasta.errors import PastaError

    with pytest.raises(PastaError, match="unknown key.*min_wrds"):
        build_teacher({"kind": "structural", "min_wrds": 3})
    with pytest.raises(PastaError, match="teacher.kind: 'gpt' is not one of structural, hf, openai"):
        build_teacher({"kind": "gpt"})


def test_promises_of_a_document_hold_exactly_the_item_text():
    doc = doc_of("How can I make my phone battery last longer?", TIPS)
    assert all(isinstance(p, Promise) and TIPS.count(p.content) == 1 for p in doc.promises)


# --- runs of points inside one paragraph ---------------------------------------------------------------------

FORESTS = (
    "Forests matter to the environment and to our daily lives in several ways. Firstly, they take part in the water "
    "cycle, absorbing surface runoff and releasing moisture into the air. Secondly, forests provide habitat for "
    "wildlife and help protect the biodiversity of whole regions. Finally, forests store carbon, which lowers the "
    "carbon dioxide in the atmosphere and slows climate change. Overall, protecting them pays off for everyone."
)


def test_ordinal_sentences_after_an_intro_become_chunks_and_the_summing_up_follows_a_sync():
    doc = doc_of("Give me three reasons why forests are important.", FORESTS)
    # The openers stay in the main thread, which orders the points; the chunks write what follows them.
    assert [item.text.split()[-1] for item in doc.items[:5:2]] == ["Firstly,", "Secondly,", "Finally,"]
    assert [p.content.split()[0] for p in doc.promises] == ["they", "forests", "forests"]
    assert doc.items[0].text.startswith("Forests matter") and len(doc.groups) == 1
    assert isinstance(doc.items[-2], Sync) and doc.items[-1].text == " Overall, protecting them pays off for everyone."
    # The opener only orders the points: topics name what each one is about.
    assert [p.topic.split()[:2] for p in doc.promises] == [["they", "take"], ["forests", "provide"], ["forests", "store"]]


def test_additive_sentences_and_parallel_examples_become_chunks():
    added = (
        "Hiring a virtual assistant can have many benefits for a small business owner. A virtual assistant costs "
        "less than a full-time employee, which lowers overhead. Furthermore, a virtual assistant can take over "
        "tedious tasks, freeing the owner to focus on higher-level work and on customers. Additionally, working "
        "with an assistant across time zones gives the business support around the clock, every day of the week."
    )
    doc = doc_of("What are the benefits of hiring a virtual assistant?", added)
    assert [item.text.split()[-1] for item in doc.items[:3:2]] == ["Furthermore,", "Additionally,"]
    examples = (
        "Many animals use tools in the wild, which was once thought to be a human trait. For example, chimpanzees "
        "strip leaves from twigs and use them to fish termites out of their mounds. Another example is the sea "
        "otter, which floats on its back and cracks open shellfish against a stone balanced on its chest."
    )
    doc = doc_of("Do animals use tools?", examples)
    # "For example," stays in the main thread; "Another example is" has no comma to split at: its chunk keeps it.
    assert doc.items[0].text.endswith("For example,") and doc.promises[1].content.startswith("Another example")


@pytest.mark.parametrize(
    ("instruction", "response"),
    [
        # imperative points of a how-to are steps
        (
            "How do I make a cup of green tea?",
            "Making green tea well takes a little care with the water. First, boil fresh water and let it cool for "
            "two minutes so it is not too hot. Second, put one teaspoon of leaves in the pot and pour the water "
            "over them slowly. Third, wait three minutes before you pour the tea into a warm cup and serve it.",
        ),
        # a sentence that reads as the next step
        (
            "How would you go about creating a sentiment analysis tool?",
            "Creating a sentiment analysis tool involves a few stages of work. First, collections of movie reviews "
            "or tweets with known sentiment are gathered. Once the data is collected, it is cleaned and tokenized "
            "for the model. Second, the data is split into training and testing sets for the classifier. Third, a "
            "neural network is trained to classify the sentiment of each text in the training set.",
        ),
        # a point that opens by pointing back at the one before
        (
            "Why do people keep dogs?",
            "People keep dogs for many reasons that go beyond simple companionship at home. First, dogs are loyal "
            "companions that greet their owners with enthusiasm every single day. Second, this loyalty makes them "
            "excellent guards for a house and the family living in it. Third, dogs encourage their owners to walk "
            "and exercise outdoors in every season of the year.",
        ),
        # no intro: the points would share nothing
        (
            "Why do people keep dogs?",
            "First, dogs are loyal companions that greet their owners with enthusiasm every single day of the "
            "year. Second, dogs make excellent guards for a house and for the family that lives in it. Third, dogs "
            "encourage their owners to walk and exercise outdoors in every season of the year.",
        ),
    ],
)
def test_sentence_runs_that_are_steps_or_build_on_each_other_stay_sequential(instruction, response):
    assert not doc_of(instruction, response).is_annotated


def test_ordinal_sentences_stay_sequential_when_the_instruction_asks_for_steps():
    assert not doc_of("List the steps to take care of a forest.", FORESTS).is_annotated
    assert not doc_of("Give me a recipe that explains forests.", FORESTS).is_annotated


@pytest.mark.parametrize(
    "instruction",
    [
        "List five things a student should avoid in order to succeed.",
        "Generate 3 story ideas about saving battery.",
        "Evaluate the options for a longer battery life.",
    ],
)
def test_instructions_that_only_look_sequential_get_tags(instruction):
    assert doc_of(instruction, TIPS).is_annotated


def test_evaluating_an_expression_stays_sequential():
    assert not doc_of("Evaluate 3x + 2 for x = 4.", TIPS).is_annotated


def test_the_turns_of_a_dialogue_stay_sequential():
    response = (
        "Friend 1: AI technology is really helpful. It can automate tedious tasks and help us get more done.\n\n"
        "Friend 2: Absolutely! It can also help us make better decisions by giving us more accurate data.\n\n"
        "Friend 1: That's true. It is also great for predicting trends and helping businesses stay ahead.\n\n"
        "Friend 2: Yes, I think it will matter more and more for businesses. It seems a good investment."
    )
    assert not doc_of("Write a discussion between two friends about AI.", response).is_annotated


def test_parts_the_text_calls_steps_stay_sequential():
    response = (
        "It is important to research thoroughly before you start writing an essay of any length.\n\n"
        "1. Get a good understanding of the essay topic and the main argument you want to make.\n"
        "2. Find at least three primary sources, such as articles, books and interviews.\n"
        "3. Take notes on what you read and mark the points that support your argument.\n\n"
        "These steps help you write a well-researched essay that supports its argument."
    )
    assert not doc_of("Draft a guide to help students research for their essays.", response).is_annotated
    assert doc_of("Draft a guide.", response.replace("These steps", "These habits")).is_annotated


# --- rules-v3: leads in the main thread, sections, nested lists ------------------------------------------------

BOLD_LEADS = (
    "Warm weather makes many people sleepy, for a few reasons that work at the same time:\n\n"
    "1. **Vasodilation**: Heat widens the blood vessels, and the drop in blood pressure feels like tiredness.\n"
    "2. **Metabolism:** The body works to shed heat, which costs energy that it would otherwise spend elsewhere.\n"
    "3. **Dehydration** - Sweating drains fluids, and even a small loss brings on fatigue quickly.\n\n"
    "Drinking water and resting in the shade help."
)


def test_bold_leads_stay_in_the_main_thread_and_name_their_chunks_in_one_word():
    doc = doc_of("Why does warmth make you tired?", BOLD_LEADS)
    texts = [item.text for item in doc.items if isinstance(item, Text)]
    assert texts[:3] == [BOLD_LEADS[: BOLD_LEADS.index("**Vasodilation**:") + 17], "\n2. **Metabolism:**",
                         "\n3. **Dehydration** -"]
    assert [p.topic for p in doc.promises] == ["Vasodilation", "Metabolism", "Dehydration"]
    assert [p.content.split()[:2] for p in doc.promises] == [["Heat", "widens"], ["The", "body"], ["Sweating", "drains"]]
    # The lead is written once: no chunk repeats it.
    assert not any(p.topic.lower() in p.content.lower() for p in doc.promises)


def test_equal_first_words_of_leads_get_longer_topics_not_numbers():
    response = BOLD_LEADS.replace("**Vasodilation**", "**Heat stress**").replace("**Metabolism:**", "**Heat loss:**")
    doc = doc_of("Why does warmth make you tired?", response)
    assert [p.topic for p in doc.promises] == ["Heat stress", "Heat loss", "Dehydration"]


def test_topic_words_below_three_give_shorter_unlabelled_topics_and_equal_ones_grow_a_word():
    response = TIPS.replace("Close apps", "Turn off apps")  # two items now open with "Turn off"
    short = StructuralAnnotator(StructuralConfig(topic_words=1))
    doc = parse(short.annotate("How do I save battery?", response))
    assert plain_text(doc) == response
    assert [p.topic for p in doc.promises] == ["Lower", "Turn off Bluetooth", "Turn off apps"]
    # The default keeps three content words (function words count half).
    assert [p.topic for p in doc_of("How do I save battery?", TIPS).promises] == [
        "Lower the screen brightness", "Turn off Bluetooth", "Close apps that refresh"]


SECTIONS = (
    "A healthy routine rests on a few habits.\n\n"
    "## Sleep\n\nMost adults need seven to nine hours a night, and a fixed bedtime makes them easier to get.\n\n"
    "## Diet\n\nVegetables, fruit and whole grains give steady energy through the day, and water beats sugary "
    "drinks.\n\n"
    "## Exercise\n\nA brisk half-hour walk most days strengthens the heart and lifts the mood.\n\n"
    "In summary, small habits add up."
)


def test_markdown_sections_become_chunks_under_headings_the_main_thread_writes():
    doc = doc_of("How can I live more healthily?", SECTIONS)
    assert [p.topic for p in doc.promises] == ["Sleep", "Diet", "Exercise"]
    assert [p.content.lstrip()[:4] for p in doc.promises] == ["Most", "Vege", "A br"]
    assert isinstance(doc.items[-2], Sync) and doc.items[-1].text == "\n\nIn summary, small habits add up."


@pytest.mark.parametrize("heading", ["Step", "Day", "Chapter"])
def test_sections_that_are_steps_of_a_sequence_stay_sequential(heading):
    numbered = SECTIONS.replace("## Sleep", f"## {heading} 1").replace("## Diet", f"## {heading} 2").replace(
        "## Exercise", f"## {heading} 3")
    assert not doc_of("How can I live more healthily?", numbered).is_annotated


def test_label_line_sections_hold_their_lists_and_an_introduction_section_stays_main():
    response = (
        "If you enjoyed it, you might like these:\n\n"
        "Series:\n- Alice in Borderland, deadly games in an empty Tokyo\n- Sweet Home, monsters in an apartment block\n\n"
        "Movies:\n- Cube, strangers waking in a maze of deadly rooms\n- Exam, eight candidates and one strange question\n\n"
        "Enjoy!"
    )
    doc = doc_of("Recommend something like Squid Game.", response)
    assert [p.topic for p in doc.promises] == ["Series", "Movies"] and doc.items[-1].text == "\n\nEnjoy!"
    intro = SECTIONS.replace("## Sleep", "## Introduction")
    assert [p.topic for p in doc_of("How can I live more healthily?", intro).promises] == ["Diet", "Exercise"]


def test_a_nested_list_goes_with_its_item_and_the_items_lead_stays_main():
    response = (
        "Language barriers shape multicultural life in several ways that are worth looking at separately:\n\n"
        "1. **Miscommunication:**\n   - Idioms rarely translate word for word between two languages.\n"
        "   - Tone and politeness differ, so a plain request can sound rude.\n"
        "2. **Isolation:**\n   - Newcomers who are not fluent may avoid social events entirely.\n"
        "   - They may struggle to reach public services and ask for help.\n\n"
        "Both can be eased with language classes."
    )
    doc = doc_of("How do language barriers affect multicultural societies?", response)
    assert [p.topic for p in doc.promises] == ["Miscommunication", "Isolation"]
    assert all(p.content.startswith("\n   - ") for p in doc.promises)


@pytest.mark.parametrize(
    ("instruction", "response"),
    [
        # numbered imperative items answering "how do I ...": steps
        ("How do I install window blinds?",
         "Installing blinds is easier than it looks when you take your time:\n\n"
         "1. **Measure the window** inside the frame, at the top, middle and bottom of the opening.\n"
         "2. **Mark the brackets** with a pencil, one at each end of the frame and level with each other.\n"
         "3. **Drill pilot holes** at the marks and screw the brackets in place firmly.\n\n"
         "Then snap the headrail into the brackets."),
        # an intro above headings calls what follows steps
        ("How should I detail my car?",
         "Here's a step-by-step guide to detailing a car:\n\n**Exterior:**\n\n"
         "- Wash the car from the top down with a soft mitt and a car shampoo.\n"
         "- Dry it with a microfiber towel so that no water spots remain.\n\n**Interior:**\n\n"
         "- Vacuum the seats, carpets and mats, and the boot as well.\n"
         "- Wipe the dashboard and the door panels with a mild cleaner."),
        # a schedule by times of day
        ("Plan my day in Paris.",
         "A relaxed day in Paris could look like this one:\n\n"
         "- **Morning:** Walk along the Seine to Notre-Dame and have coffee on the Île Saint-Louis.\n"
         "- **Afternoon:** Visit the Musée d'Orsay and its rooms of impressionist paintings.\n"
         "- **Evening:** Take a boat ride at sunset and have dinner in the Latin Quarter."),
        # "1. Start with ...": a procedure, whatever the instruction asked
        ("Give me a tip on German verbs.",
         "Regular German verbs follow one pattern in the present tense:\n\n"
         "1. Start with the infinitive of the verb, for example spielen, to play.\n"
         "2. Remove the ending en to find the stem of the verb, here spiel.\n"
         "3. Add the ending that belongs to the subject, like e for ich and st for du."),
        # a point that says it contrasts with the one before
        ("What is the difference between architecture and organization?",
         "The two terms describe a computer at two different levels of detail:\n\n"
         "1. Architecture describes the instruction set and the behaviour that a programmer can see.\n"
         "2. Organization, on the other hand, describes how the hardware units implement that behaviour."),
    ],
)
def test_v3_sequences_stay_sequential(instruction, response):
    assert not doc_of(instruction, response).is_annotated


def test_a_label_or_dash_lead_is_one_only_when_every_item_of_the_group_has_one():
    response = (
        "Here are three synonyms of adversity, each with its own shade of meaning:\n\n"
        "1. Hardship - suffering that comes from a lack of money, food or shelter over time.\n"
        "2. Calamity - a sudden disaster that causes great damage or distress to many people.\n"
        "3. Setback - a reversal that halts progress for a while but is usually less severe."
    )
    doc = doc_of("Give synonyms of adversity.", response)
    assert [p.topic for p in doc.promises] == ["Hardship", "Calamity", "Setback"]
    mixed = response.replace("3. Setback - a reversal", "3. A setback is a reversal")
    doc = doc_of("Give synonyms of adversity.", mixed)
    assert [item.text for item in doc.items if isinstance(item, Text)][1] == "\n2."  # only the markers stay


def test_word_problems_and_their_worked_parts_stay_sequential():
    response = (
        "Marie spent:\n\nFor the combos: 2 x $50 = $100, and for the t-shirts: 2 x $5 = $10 in all.\n\n"
        "Total spent: $100 + $10 = $110, which is what she paid at the store that day."
    )
    assert not doc_of("Marie bought two $50 combos and two $5 t-shirts. How much did she spend?", response).is_annotated
    worked = (
        "To solve this, we track both cars and the savings month by month.\n\n"
        "Let's denote:\n- V as the value of the old car in dollars\n- S as the savings so far in dollars\n\n"
        "Given:\n- V = 2000 dollars at the start of the year\n- S = 0 dollars before the first month"
    )
    instruction = "His car is worth $2000 and he saves $1000 a month. How many months until he can buy an $8000 car?"
    assert not doc_of(instruction, worked).is_annotated  # "Given:" uses what "Let's denote:" defines


def test_only_a_count_of_plural_things_in_the_last_sentence_announces_paragraphs():
    paragraphs = (
        "\n\nDuring his life he made many contributions to electricity, magnetism and wireless communication, and he "
        "held several hundred patents."
        "\n\nToday many of his ideas still live on in the power grids, motors and radios that surround us every day."
    )
    story = "He began working for Edison, but the two soon had a falling out over money." + paragraphs
    assert not doc_of("Write a short biography of Tesla.", story).is_annotated
    announced = "His work falls into two broad areas." + paragraphs
    assert len(doc_of("Write a short biography of Tesla.", announced).promises) == 2


def test_a_dash_lead_may_hold_a_hyphenated_name():
    response = (
        "Several thinkers shaped modern democracy more than most others did:\n\n"
        "1. John Locke - an English philosopher whose ideas underpinned two revolutions.\n"
        "2. Jean-Jacques Rousseau - a French philosopher who wrote about the social contract.\n"
        "3. Thomas Paine - a writer whose pamphlet Common Sense argued for independence."
    )
    doc = doc_of("Name thinkers who influenced democracy.", response)
    assert [p.topic for p in doc.promises] == ["John", "Jean-Jacques", "Thomas"]


def test_no_two_promises_of_an_answer_share_a_topic_even_in_two_lists():
    """The decoder's grammar allows no topic twice in one answer (its words, whatever their case): the teacher
    never writes one, so the student never learns what it could not decode."""
    phone = ("- **Price**: it costs less than most phones of its class, and often goes on sale.\n"
             "- **Camera**: it takes sharp photos in daylight and decent ones at night too.\n")
    response = ("Phone A is a good choice for most people who want a phone that lasts.\n\n" + phone +
                "\nPhone B is the choice for people who want the most features they can get.\n\n" + phone)
    doc = doc_of("Compare these two phones.", response)
    words = [tuple(re.findall(r"\w+", p.topic.lower())) for p in doc.promises]
    assert len(doc.groups) == 2 and len(words) == 4 and len(set(words)) == 4


def test_a_bold_then_makes_its_list_sequential():
    response = ("Here is how to get a good cake out of your oven this weekend:\n\n"
                "1. **Preheat** the oven to 180 degrees and grease the round tin with butter.\n"
                "2. **Then** mix the flour, the sugar and the eggs in a large bowl until smooth.\n"
                "3. **Finally** pour the batter into the tin and bake it for forty minutes.")
    assert not doc_of("Give me tips for a cake", response).is_annotated


def test_a_sentence_pointing_back_at_the_points_stays_in_the_main_thread_after_them():
    response = ("Regular exercise helps you for two main reasons. First, it strengthens your heart and lungs so "
                "that everyday effort feels easier. Second, it lifts your mood by releasing endorphins and lowering "
                "stress. Both benefits grow over time, so the first one makes the second one even easier to feel.")
    doc = doc_of("Why should I exercise?", response)
    assert len(doc.promises) == 2 and not any("Both" in p.content for p in doc.promises)
    assert isinstance(doc.items[-2], Sync) and doc.items[-1].text.startswith(" Both benefits")
