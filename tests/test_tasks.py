"""Tests for nest_integrations.evaluation.tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nest_integrations.corpus import Passage
from nest_integrations.evaluation.tasks import (
    TASKS,
    EvalItem,
    bio_items,
    completion_items,
    get_task,
    is_person_title,
    qa_items,
    split_sentences,
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
    from nest_integrations.corpus import load_wikipedia_summaries

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


# --------------------------------------------------------------------------- registry


def test_registry() -> None:
    assert set(TASKS) == {"bio", "completion", "qa"}
    assert get_task("bio") is bio_items
    assert get_task("qa") is qa_items
    with pytest.raises(ValueError, match="bio, completion, qa"):
        get_task("summarise")
