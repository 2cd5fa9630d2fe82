"""Tests for nest_benchmarks.tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_integrations.corpus.passages import Passage
from nest_benchmarks.docs_corpus import (
    DOCS_CHUNKINGS,
    DOCS_MODULES,
    docs_corpus,
    docs_passages,
    docs_splitter_chunks,
)
from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.tasks import (
    QA_TASKS,
    TASK_MAX_NEW_TOKENS,
    TASKS,
    WIKI_QA_KINDS,
    EvalItem,
    bio_items,
    markdown_qa_items,
    completion_items,
    docs_items,
    get_task,
    is_person_title,
    qa_items,
    split_sentences,
    wiki_qa_items,
    wiki_questions,
)

LONG_TAIL = "Then " + " ".join(f"word{i}" for i in range(20)) + "."


def _people() -> list[Passage]:
    """Hand-made "People" pool with some titles that must be skipped."""
    names = ["Marie Curie", "Albert Einstein", "Ada Lovelace", "Alan Turing", "Rosalind Franklin",
             "Niels Bohr", "Emmy Noether", "Peter the Great"]
    skipped = ["Hans Krebs (biochemist)", "Charles V, Holy Roman Emperor", "Baybars",
               "14th Dalai Lama", "The Doors", "Laurel and Hardy"]
    passages = [
        Passage(id=t, title=t, text=f"{t} was a notable person. {LONG_TAIL}",
                metadata={"topic": "People", "description": "scientist"})
        for t in names + skipped
    ]
    passages.append(Passage(id="Pink Floyd", title="Pink Floyd", text="Pink Floyd were a band.",
                            metadata={"topic": "People", "description": "English rock band"}))
    passages.append(Passage(id="Black Hole", title="Black Hole", text="A black hole is dense.",
                            metadata={"topic": "Physical sciences"}))
    return passages


# --------------------------------------------------------------------------- bio


def test_is_person_title() -> None:
    assert is_person_title("Marie Curie")
    assert is_person_title("T. S. Eliot")
    assert is_person_title("Gwanggaeto the Great")
    assert not is_person_title("Hans Krebs (biochemist)")
    assert not is_person_title("Mary, Queen of Scots")
    assert not is_person_title("Aeschylus")
    assert not is_person_title("The Rolling Stones")
    assert not is_person_title("Lumière brothers")
    assert not is_person_title("Led Zeppelin", "English rock band (1968–1980)")


def test_bio_items_deterministic_formatted_and_filtered() -> None:
    pool = _people()
    first = bio_items(5, seed=3, passages=pool)
    assert first == bio_items(5, seed=3, passages=list(reversed(pool)))  # order-independent
    assert len(first) == 5
    assert len({item.id for item in first}) == 5
    allowed = {"Marie Curie", "Albert Einstein", "Ada Lovelace", "Alan Turing",
               "Rosalind Franklin", "Niels Bohr", "Emmy Noether", "Peter the Great"}
    by_id = {p.id: p for p in pool}
    for item in first:
        name = item.meta["name"]
        assert name in allowed
        assert item.prompt == f"Tell me a bio of {name}."
        assert item.query == name
        assert item.reference == by_id[item.meta["passage_id"]].text
    assert bio_items(0, passages=pool) == []
    seeds = {tuple(i.id for i in bio_items(5, seed=s, passages=pool)) for s in range(5)}
    assert len(seeds) > 1  # the seed matters


def test_bio_items_errors() -> None:
    with pytest.raises(ValueError, match="only 8 candidates"):
        bio_items(9, passages=_people())
    with pytest.raises(ValueError):
        bio_items(-1, passages=_people())


def test_bio_items_default_wikipedia_pool() -> None:
    items = bio_items(20, seed=0)
    assert items == bio_items(20, seed=0)
    assert len(items) == 20
    for item in items:
        assert is_person_title(item.meta["name"])
        assert item.prompt == f"Tell me a bio of {item.meta['name']}."
        assert item.reference.strip()


# --------------------------------------------------------------------------- completion


def test_split_sentences_handles_initials_and_abbreviations() -> None:
    text = ("  2001: A Space Odyssey is a film by Stanley Kubrick, co-written with Arthur C. Clarke. "
            "It was made in the U.S. and the U.K. in c. 1965. \"Is it good?\" Yes!  ")
    sentences = [text[a:b] for a, b in split_sentences(text)]
    assert sentences == [
        "2001: A Space Odyssey is a film by Stanley Kubrick, co-written with Arthur C. Clarke.",
        "It was made in the U.S. and the U.K. in c. 1965.",
        "\"Is it good?\"",
        "Yes!",
    ]
    assert split_sentences("   ") == []
    assert split_sentences("no terminal punctuation") == [(0, 23)]


def test_completion_items_reconstruct_summary() -> None:
    long_text = f"Marie Curie was a physicist.\n{LONG_TAIL} Second part here."
    pool = [
        Passage(id="a", title="A", text=long_text),
        Passage(id="b", title="B", text="Short one. Too short to continue."),
        Passage(id="c", title="C", text=f"One sentence only {LONG_TAIL[:-1]}"),
    ]
    items = completion_items(1, passages=pool)
    assert len(items) == 1
    item = items[0]
    assert item.prompt == item.query == "Marie Curie was a physicist."
    assert item.meta["chat"] is False and item.meta["passage_id"] == "a"
    gap = long_text[len(item.prompt) : len(long_text) - len(item.reference)]
    assert item.prompt + gap + item.reference == long_text
    assert gap.isspace()
    with pytest.raises(ValueError):
        completion_items(2, passages=pool)

    two = completion_items(1, passages=pool, prefix_sentences=2, min_continuation_words=2)[0]
    assert two.prompt == f"Marie Curie was a physicist.\n{LONG_TAIL}"
    assert two.reference == "Second part here."
    with pytest.raises(ValueError):
        completion_items(1, passages=pool, prefix_sentences=0)


def test_completion_items_default_wikipedia_pool() -> None:
    from nest_integrations.corpus.loaders import load_wikipedia_summaries

    texts = {p.id: p.text for p in load_wikipedia_summaries()}
    items = completion_items(25, seed=1)
    assert items == completion_items(25, seed=1)
    for item in items:
        summary = texts[item.meta["passage_id"]]
        assert summary.startswith(item.prompt) and summary.endswith(item.reference)
        gap = summary[len(item.prompt) : len(summary) - len(item.reference)]
        assert gap.isspace()
        assert len(item.reference.split()) >= 15
        assert item.prompt[-1] in ".!?\"')]"


# --------------------------------------------------------------------------- qa


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_qa_items_parse(tmp_path: Path) -> None:
    path = _write(tmp_path, [
        json.dumps({"question": "Who discovered radium?", "answers": ["Marie Curie", "Curie"], "id": 7}),
        "",
        json.dumps({"question": " Capital of France? ", "answers": ["Paris"]}),
    ])
    items = qa_items(path)
    assert items == [
        EvalItem(id="7", prompt="Who discovered radium?", query="Who discovered radium?",
                 reference="", meta={"answers": ["Marie Curie", "Curie"], "chat": True}),
        EvalItem(id="qa/3", prompt="Capital of France?", query="Capital of France?",
                 reference="", meta={"answers": ["Paris"], "chat": True}),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"answers": ["x"]}), "'question'"),
        (json.dumps({"question": "q?", "answers": []}), "'answers'"),
        (json.dumps({"question": "q?", "answers": "Paris"}), "'answers'"),
        (json.dumps({"question": "q?", "answers": ["ok", 3]}), "'answers'"),
    ],
)
def test_qa_items_bad_lines(tmp_path: Path, line: str, message: str) -> None:
    good = json.dumps({"question": "q?", "answers": ["a"]})
    path = _write(tmp_path, [good, line])
    with pytest.raises(ValueError, match=message) as info:
        qa_items(path)
    assert f"{path}:2" in str(info.value)


def test_qa_items_duplicate_ids_and_empty_file(tmp_path: Path) -> None:
    record = json.dumps({"question": "q?", "answers": ["a"], "id": "x"})
    with pytest.raises(ValueError, match="duplicate"):
        qa_items(_write(tmp_path, [record, record]))
    with pytest.raises(ValueError, match="no QA records"):
        qa_items(_write(tmp_path, [""]))
    with pytest.raises(FileNotFoundError):
        qa_items(tmp_path / "missing.jsonl")


# --------------------------------------------------------------------------- wiki-qa


def _summary(title: str, text: str, description: str, topic: str = "People") -> Passage:
    return Passage(id=title, title=title, text=text, metadata={"topic": topic, "description": description})


def test_wiki_questions_people() -> None:
    weber = _summary("Max Weber", "Maximilian Carl Emil Weber was a German sociologist, historian, jurist, "
                     "and political economist. He lived (1864–1920) in Erfurt.",
                     "German sociologist, jurist, and political economist (1864–1920)")
    questions = {kind: (q, a) for kind, q, a in wiki_questions(weber)}
    assert questions["nationality"] == ("What nationality was Max Weber?", ["German"])
    assert questions["profession"] == ("What was Max Weber's profession?", ["sociologist", "jurist", "political economist"])
    assert questions["born"] == ("In what year was Max Weber born?", ["1864"])
    assert questions["died"] == ("In what year did Max Weber die?", ["1920"])
    # a year the text does not state as a lifespan is never asked; a title word is not a nationality
    austen = _summary("Jane Austen", "Jane Austen was an English writer of novels. In 1811 she published.",
                      "English novelist (1775–1817)")
    assert [k for k, _, _ in wiki_questions(austen)] == ["nationality"]
    sultan = _summary("Sher Shah Suri", "Sher Shah Suri was the Sultan of Hindustan.", "Sultan of Hindustan")
    assert wiki_questions(sultan) == []


def test_wiki_questions_other_topics() -> None:
    timbuktu = _summary("Timbuktu", "Timbuktu is an ancient city in Mali, north of the Niger River.",
                        "City in Tombouctou Region, Mali", "Geography")
    assert wiki_questions(timbuktu) == [("location", "Where is Timbuktu?", ["Mali"])]
    tomato = _summary("Tomato", "The tomato is a plant whose fruit is an edible berry.", "Edible berry",
                      "Biology and health sciences")
    assert wiki_questions(tomato) == [("definition", "What is the tomato?", ["edible berry"])]
    kingston = _summary("Kingston, Jamaica", "Kingston is the capital of Jamaica.", "Capital city of Jamaica", "Geography")
    assert wiki_questions(kingston) == []  # the answer is in the question


def test_wiki_qa_items_from_the_summaries() -> None:
    pool = load_wikipedia_summaries()
    by_id = {p.id: p for p in pool}
    items = wiki_qa_items(60, seed=1, passages=pool)
    assert [i.id for i in items] == [i.id for i in wiki_qa_items(60, seed=1, passages=pool)]
    assert [i.prompt for i in items] != [i.prompt for i in wiki_qa_items(60, seed=2, passages=pool)]
    for item in items:
        gold = by_id[item.meta["passage_id"]].text
        assert item.prompt == item.query and item.prompt.endswith("?") and item.meta["chat"] is True
        assert item.meta["kind"] in WIKI_QA_KINDS and item.meta["answers"]
        for answer in item.meta["answers"]:
            assert answer in gold and len(answer.split()) <= 4
    assert {i.meta["kind"] for i in items} >= {"nationality", "profession", "location", "definition"}
    with pytest.raises(ValueError, match="wiki-qa"):
        wiki_qa_items(5, passages=pool[:3])


# --------------------------------------------------------------------------- docs


def test_docs_corpus_documents_and_chunks() -> None:
    docs = docs_corpus()
    assert [d.id for d in docs] == list(DOCS_MODULES) and all(d.title == d.id for d in docs)
    json_doc = docs[DOCS_MODULES.index("json")].text
    assert "\ndumps(obj, *, skipkeys=False" in json_doc and "Serialize ``obj``" in json_doc
    assert " at 0x" not in "".join(d.text for d in docs)  # no memory addresses: the same text in every process
    by_id = {d.id: d.text for d in docs}
    for chunking in DOCS_CHUNKINGS:
        chunks = docs_passages(chunking)
        assert {c.doc_id or c.id for c in chunks} == set(DOCS_MODULES)
        for chunk in chunks:
            assert by_id[chunk.doc_id or chunk.id][chunk.doc_char_start : chunk.doc_char_end] == chunk.text
    splitter = docs_splitter_chunks(docs)
    assert len(splitter) > len(docs) and max(len(c.text) for c in splitter) <= 4000
    with pytest.raises(ValueError, match="chunking"):
        docs_passages("sentences")
    with pytest.raises(ValueError, match="cannot import"):
        docs_corpus(("no_such_module_here",))


def test_docs_items_answers_occur_in_their_document() -> None:
    items = docs_items()
    assert len(items) >= 40 and len({i.id for i in items}) == len(items)
    by_id = {d.id: d.text for d in docs_corpus()}
    for item in items:
        assert item.prompt.endswith("?") and item.meta["passage_id"] in by_id
        for answer in item.meta["answers"]:
            assert answer_recall(by_id[item.meta["passage_id"]], [answer]) == 1.0, (item.id, answer)
    sample = docs_items(5, seed=3)
    assert [i.id for i in sample] == [i.id for i in docs_items(5, seed=3)] and len(sample) == 5
    with pytest.raises(ValueError, match="docs"):
        docs_items(len(items) + 1)


def test_qa_items_keep_a_gold_passage(tmp_path: Path) -> None:
    path = _write(tmp_path, [json.dumps({"question": "q?", "answers": ["a"], "doc_id": "json"}),
                             json.dumps({"question": "r?", "answers": ["b"]})])
    first, second = qa_items(path)
    assert first.meta["passage_id"] == "json" and "passage_id" not in second.meta
    with pytest.raises(ValueError, match="doc_id"):
        qa_items(_write(tmp_path, [json.dumps({"question": "q?", "answers": ["a"], "doc_id": 3})]))


# --------------------------------------------------------------------------- registry


def test_registry() -> None:
    assert set(TASKS) == {"bio", "completion", "qa", "wiki-qa", "docs", "markdown-docs", "markdown-docs-pino", "wiki-qa-hard", "markdown-qa"}
    assert QA_TASKS <= set(TASKS) and set(TASK_MAX_NEW_TOKENS) == set(TASKS)
    # Your own documentation questions are answered at nest generate's budget; the bundled sets at 64.
    assert all(TASK_MAX_NEW_TOKENS[t] == (NestConfig().max_new_tokens if t == "markdown-qa" else 64) for t in QA_TASKS)
    assert get_task("bio") is bio_items
    assert get_task("qa") is qa_items
    assert get_task("wiki-qa") is wiki_qa_items and get_task("docs") is docs_items
    assert get_task("markdown-qa") is markdown_qa_items
    with pytest.raises(ValueError, match="bio, completion, docs, markdown-docs, markdown-docs-pino, markdown-qa, qa, wiki-qa"):
        get_task("summarise")
