"""Tests for the wiki-qa-hard task: hand-written questions whose answers lie past a summary's first sentence."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from nest_integrations.corpus.chunking import sentence_spans
from nest_integrations.corpus.loaders import load_wikipedia_summaries
from nest_integrations.corpus.passages import Passage
from nest_benchmarks import tasks
from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.runner import load_items, run_eval
from nest_benchmarks.tasks import (
    QA_TASKS,
    TASK_MAX_NEW_TOKENS,
    WIKI_QA_HARD_PATH,
    get_task,
    wiki_qa_hard_items,
)
from nest_integrations.index.nest_index import NestIndex

# The relevance gate re-embeds every retrieved passage with MiniLM; the runner's logic does not depend on it.
FAST = {"min_passage_relevance": -1.0}


@pytest.fixture(scope="module")
def people() -> dict[str, Passage]:
    """The People summaries (the default index's corpus) by passage id."""
    return {p.id: p for p in load_wikipedia_summaries(topic="People")}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return [json.loads(line) for line in WIKI_QA_HARD_PATH.read_text(encoding="utf-8").splitlines()]


def _answerable(records: list[dict]) -> list[dict]:
    return [r for r in records if not r["unanswerable"]]


def _unanswerable(records: list[dict]) -> list[dict]:
    return [r for r in records if r["unanswerable"]]


# --------------------------------------------------------------------------- the question set


def test_set_size_and_spread(records):
    answerable = _answerable(records)
    assert 55 <= len(answerable) <= 70 and len(_unanswerable(records)) == 10
    assert len({r["passage_id"] for r in answerable}) >= 50
    assert len({r["id"] for r in records}) == len(records)
    openings = Counter(r["question"].split()[0] for r in answerable)
    assert {"Where", "When", "What", "Which", "Who", "How"} <= set(openings)


def test_every_answer_is_in_the_summary_but_not_its_first_sentence(records, people):
    for record in _answerable(records):
        passage = people[record["passage_id"]]
        assert record["name"] == passage.title and record["name"] in record["question"], record["id"]
        text = passage.text
        first = text[slice(*sentence_spans(text)[0])]
        canonical = record["answers"][0]  # short and verbatim; the others are variants (a full name)
        assert canonical in text and 1 <= len(canonical.split()) <= 4, record["id"]
        for answer in record["answers"]:
            # answer_recall is the scorer: the summary must score, its first sentence must not.
            assert answer_recall(text, [answer]) == 1.0, (record["id"], answer)
            assert answer_recall(first, [answer]) == 0.0, (record["id"], answer)


def test_unanswerable_names_occur_in_no_summary(records):
    corpus = "\n".join(f"{p.title}\n{p.text}" for p in load_wikipedia_summaries()).casefold()
    for record in _unanswerable(records):
        name = record["name"]
        assert name in record["question"]
        assert name.casefold() not in corpus and name.split()[-1].casefold() not in corpus, name


# --------------------------------------------------------------------------- the task


def test_task_is_registered_as_a_short_answer_question_task():
    assert get_task("wiki-qa-hard") is wiki_qa_hard_items
    assert "wiki-qa-hard" in QA_TASKS and TASK_MAX_NEW_TOKENS["wiki-qa-hard"] == 64


def test_items_carry_the_gold_passage_or_are_marked_unanswerable(records):
    items = wiki_qa_hard_items()
    assert [item.id for item in items] == [r["id"] for r in records]
    for item, record in zip(items, records):
        assert item.prompt == item.query == record["question"] and item.reference == ""
        assert item.meta["answers"] == record["answers"] and item.meta["chat"] is True
        assert item.meta["unanswerable"] is record["unanswerable"]
        if record["unanswerable"]:
            assert item.meta["kind"] == "unanswerable" and "passage_id" not in item.meta
        else:
            assert item.meta["kind"] == "fact" and item.meta["passage_id"] == record["passage_id"]


def test_a_draw_is_deterministic_and_keeps_unanswerable_questions():
    drawn = wiki_qa_hard_items(20, seed=3)
    assert [i.id for i in drawn] == [i.id for i in wiki_qa_hard_items(20, seed=3)]
    assert len(drawn) == 20 and 1 <= sum(i.meta["unanswerable"] for i in drawn) <= 4
    with pytest.raises(ValueError, match="asked for 100"):
        wiki_qa_hard_items(100)


def test_the_runner_takes_every_question_by_default():
    assert len(load_items("wiki-qa-hard")) == len(wiki_qa_hard_items())


@pytest.mark.parametrize(
    "edit, field",
    [
        ({"answers": ["Pisa"], "unanswerable": True}, "answers"),
        ({"passage_id": None}, "passage_id"),
        ({"answers": []}, "answers"),
        ({"unanswerable": "no"}, "unanswerable"),
        ({"name": ""}, "name"),
    ],
)
def test_a_malformed_record_names_its_field(monkeypatch, tmp_path, edit, field):
    good = {"id": "q", "question": "In which city was Galileo Galilei born?", "answers": ["Pisa"],
            "passage_id": "Galileo Galilei", "name": "Galileo Galilei", "unanswerable": False}
    path = tmp_path / "hard.jsonl"
    path.write_text(json.dumps({**good, **edit}) + "\n", encoding="utf-8")
    monkeypatch.setattr(tasks, "WIKI_QA_HARD_PATH", path)
    with pytest.raises(ValueError, match=rf"hard.jsonl:1: .*'{field}'"):
        wiki_qa_hard_items()


# --------------------------------------------------------------------------- a run


def test_absent_removes_the_summary_and_skips_nothing_for_unanswerable(tiny_lm, people, tmp_path):
    gold = sorted({item.meta["passage_id"] for item in wiki_qa_hard_items() if "passage_id" in item.meta})
    index = NestIndex.build([people[g] for g in gold], tiny_lm, show_progress=False)
    run_eval(index, "wiki-qa-hard", n=4, modes=("rag",), conditions=("present", "absent"),
             max_new_tokens=4, out_dir=tmp_path, config_overrides=FAST, show_progress=False)
    written = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert {r["condition"] for r in written} == {"present", "absent"} and len(written) == 8
    for record in written:
        if record["meta"]["unanswerable"]:
            assert record["metrics"]["answer_recall"] is None
        elif record["condition"] == "absent":
            assert record["meta"]["passage_id"] not in record["retrieved_ids"]
