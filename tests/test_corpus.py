"""Corpus loading, chunking and persistence (offline; the wiki data ships with a package)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nest_integrations.corpus.chunking import chunk_passages, chunk_text, sentence_spans
from nest_integrations.corpus.loaders import (
    load_corpus,
    load_jsonl,
    load_text_folder,
    load_wikipedia_summaries,
    wikipedia_summaries_path,
)
from nest_integrations.corpus.passages import Passage, load_passages_jsonl, save_passages_jsonl
from nest_integrations.policy.relevance import lead

DOC = (
    "Zoë Ångström ☃ studied snow.  She wrote: \"Crystals grow!\" Was it cold?\n\n"
    "Heading without a full stop\n"
    + " ".join(f"word{i}" for i in range(37))
    + ". Final sentence here…  "
)


def _words(s: str) -> int:
    return len(s.split())


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- Passage -----------------------------------------------------------------


def test_passage_dict_round_trip_and_offsets():
    p = Passage("d#1", "bc", title="T", metadata={"k": [1, "ü"]}, doc_id="d", doc_char_start=1)
    assert p.doc_char_end == 3
    assert Passage.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert hash(p) == hash(Passage("d#1", "bc", title="T", metadata={"other": 1}, doc_id="d", doc_char_start=1))


def test_passage_from_dict_rejects_unknown_and_missing_fields():
    with pytest.raises(ValueError, match="unknown Passage field"):
        Passage.from_dict({"id": "a", "text": "t", "body": "x"})
    with pytest.raises(ValueError, match="missing required"):
        Passage.from_dict({"id": "a"})


# -- chunking ----------------------------------------------------------------


@pytest.mark.parametrize("max_words", [1, 3, 7, 12, 1000])
def test_chunk_text_offsets_reproduce_text_within_budget(max_words):
    spans = chunk_text(DOC, max_words=max_words)
    assert spans, "non-blank text gives at least one chunk"
    assert all(a < b for a, b in spans) and all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    for a, b in spans:
        chunk = DOC[a:b]
        assert chunk == chunk.strip(), "ranges exclude surrounding whitespace"
        assert _words(chunk) <= max_words
    # Chunks plus the whitespace between them reproduce the document exactly.
    bounds = [0, *(x for span in spans for x in span), len(DOC)]
    gaps = [DOC[bounds[i] : bounds[i + 1]] for i in range(0, len(bounds), 2)]
    assert all(not gap.strip() for gap in gaps)
    assert "".join(g + DOC[a:b] for g, (a, b) in zip(gaps, spans)) + gaps[-1] == DOC


def test_chunk_text_prefers_sentence_boundaries_and_splits_long_sentences():
    spans = chunk_text(DOC, max_words=10)
    chunks = [DOC[a:b] for a, b in spans]
    assert chunks[0] == 'Zoë Ångström ☃ studied snow.  She wrote: "Crystals grow!"'
    assert "Was it cold?" in chunks[1]
    long_parts = [c for c in chunks if "word" in c]
    assert len(long_parts) >= 4, "the 38-word sentence is split on word boundaries"
    assert all(_words(c) <= 10 for c in long_parts)


def test_chunk_text_token_budget_with_callable_and_hf_tokenizer():
    spans = chunk_text(DOC, max_tokens=5, tokenizer=str.split)
    assert all(len(DOC[a:b].split()) <= 5 for a, b in spans)

    from transformers import AutoTokenizer

    from nest_integrations.retrieval import default_embedder_path

    tok = AutoTokenizer.from_pretrained(default_embedder_path())
    spans = chunk_text(DOC, max_tokens=12, tokenizer=tok)
    assert all(len(tok.encode(DOC[a:b], add_special_tokens=False)) <= 12 for a, b in spans)
    assert len(spans) > 3


def test_chunk_text_edge_cases_and_validation():
    assert chunk_text("   \n ") == []
    assert chunk_text("  one  ") == [(2, 5)]
    with pytest.raises(ValueError, match="together"):
        chunk_text("a b", max_tokens=3)
    with pytest.raises(ValueError, match="max_words"):
        chunk_text("a b", max_words=0)


def test_chunk_passages_keeps_short_docs_and_maps_chunks_into_documents():
    long_doc = Passage("long", DOC, title="Snow", metadata={"src": "x"})
    short_doc = Passage("short", "Tiny doc.", title="Tiny")
    out = chunk_passages([long_doc, short_doc], max_words=8)
    short = [p for p in out if p.doc_id == "short"]
    assert short == [Passage("short", "Tiny doc.", title="Tiny", doc_id="short")]
    chunks = [p for p in out if p.doc_id == "long"]
    assert [p.id for p in chunks] == [f"long#{i}" for i in range(len(chunks))]
    for p in chunks:
        assert DOC[p.doc_char_start : p.doc_char_end] == p.text
        assert p.title == "Snow" and p.metadata == {"src": "x"}
    # Cutting a chunk again keeps offsets relative to the original document.
    again = chunk_passages([chunks[-2]], max_words=2)
    assert len(again) > 1
    assert all(p.doc_id == "long" and DOC[p.doc_char_start : p.doc_char_end] == p.text for p in again)


# -- loaders -----------------------------------------------------------------


def test_load_jsonl_metadata_and_default_ids(tmp_path):
    path = _write_jsonl(
        tmp_path / "notes.jsonl",
        [
            json.dumps({"id": "a", "title": "A", "text": "Alpha text.", "url": "http://a", "year": 2020}),
            "",
            json.dumps({"text": "No id here."}),
            json.dumps({"id": 7, "text": "Numeric id."}),
        ],
    )
    passages = load_jsonl(path)
    assert [p.id for p in passages] == ["a", "notes:3", "7"]
    assert passages[0].title == "A" and passages[0].metadata == {"url": "http://a", "year": 2020}
    assert passages[1].title == "" and passages[1].text == "No id here."


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", r"bad\.jsonl:2: invalid JSON"),
        (json.dumps({"id": "x"}), r"bad\.jsonl:2: missing or empty \"text\""),
        (json.dumps({"id": "x", "text": "  "}), r"bad\.jsonl:2: missing or empty"),
        (json.dumps({"id": "a", "text": "again"}), r"bad\.jsonl:2: duplicate id 'a' \(first seen on line 1\)"),
    ],
)
def test_load_jsonl_errors_name_the_line(tmp_path, bad_line, message):
    path = _write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"id": "a", "text": "ok"}), bad_line])
    with pytest.raises(ValueError, match=message):
        load_jsonl(path)


def test_load_text_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("Bee text.\n", encoding="utf-8")
    (tmp_path / "sub" / "a.txt").write_text("Ay text.", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("  ", encoding="utf-8")
    (tmp_path / "skip.md").write_text("not a txt", encoding="utf-8")
    passages = load_text_folder(tmp_path)
    assert [(p.id, p.title, p.text) for p in passages] == [("b.txt", "b", "Bee text.\n"), ("sub/a.txt", "a", "Ay text.")]
    assert passages[1].metadata == {"path": str(tmp_path / "sub" / "a.txt")}
    with pytest.raises(ValueError, match="no non-empty files"):
        load_text_folder(tmp_path, pattern="*.rst")


def test_wikipedia_summaries_topic_filter_and_limit():
    assert wikipedia_summaries_path().name == "summaries_en-us.json"
    people = load_wikipedia_summaries("People")
    assert len(people) == 1828 + 66, "labelled people plus the unlabelled ones (lifespan in the description)"
    ids = {p.id for p in people}
    assert {"Marie Curie", "Albert Einstein", "Ada Lovelace"} <= ids
    assert not {"World War II", "The Beatles", "Tang dynasty", "Great Depression"} & ids
    assert load_wikipedia_summaries("people") == people, "topic match is case-insensitive"
    first = people[0]
    assert first.id == first.title and first.text
    assert first.metadata["topic"] == "People" and first.metadata["source"] == "wikipedia"
    assert "description" in first.metadata
    assert load_wikipedia_summaries("People", limit=5) == people[:5]
    assert len(load_wikipedia_summaries(limit=10)) == 10


def test_wikipedia_unknown_topic_lists_available_topics():
    with pytest.raises(ValueError, match=r"unknown Wikipedia topic 'Peeple'.*'People'"):
        load_wikipedia_summaries("Peeple")


def test_load_corpus_dispatch(tmp_path):
    assert [p.id for p in load_corpus("wiki", topic="Mathematics", limit=3)] == [
        p.id for p in load_wikipedia_summaries("Mathematics", limit=3)
    ]
    path = _write_jsonl(tmp_path / "c.jsonl", [json.dumps({"text": f"t{i}"}) for i in range(4)])
    assert len(load_corpus(str(path), limit=2)) == 2
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.txt").write_text("x text", encoding="utf-8")
    assert [p.id for p in load_corpus(str(tmp_path / "docs"))] == ["x.txt"]
    with pytest.raises(ValueError, match="unrecognised corpus source"):
        load_corpus(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="only applies to source='wiki'"):
        load_corpus(str(path), topic="People")


def test_passages_jsonl_round_trip(tmp_path):
    passages = chunk_passages(
        [Passage("doc", DOC, title="Snow ☃", metadata={"n": 1, "tags": ["a"]}), Passage("p2", "Short.")], max_words=9
    )
    path = tmp_path / "store" / "passages.jsonl"
    save_passages_jsonl(passages, path)
    assert load_passages_jsonl(path) == passages


def test_initials_and_titles_do_not_end_a_sentence():
    text = "J. R. R. Tolkien met Dr. Watson in St. Louis. They talked.\nU.S. Army records say so."
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        "J. R. R. Tolkien met Dr. Watson in St. Louis.", "They talked.", "U.S. Army records say so.",
    ]
    assert lead("Dr. Martin Luther King Jr. was an American minister. He led marches.") == (
        "Dr. Martin Luther King Jr. was an American minister."
    ), "the gate reads a passage's opening with the same splitter"
