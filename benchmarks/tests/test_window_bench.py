"""``nest bench windows`` on a hand-made domain: the window the decoder plans, whether the answer
is in it, at a budget that holds it and one that cuts it, and what the gate keeps for a question
the passages do not answer."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_benchmarks.tasks import EvalItem
from nest_benchmarks.window_bench import domain_report, item_row, write_window_bench
from nest_integrations.index.nest_index import NestIndex

PASSAGES = [
    Passage(id="curie", title="Marie Curie", text=(
        "Marie Curie was a Polish and naturalised-French physicist and chemist who conducted pioneering research "
        "on radioactivity. She was born in 1867 in Warsaw, the youngest of five children of two teachers.")),
    Passage(id="turing", title="Alan Turing", text=(
        "Alan Turing was an English mathematician, computer scientist and cryptanalyst. He was born in 1912 in "
        "Maida Vale, London, and formalised the concepts of algorithm and computation with the Turing machine.")),
    Passage(id="lovelace", title="Ada Lovelace", text=(
        "Ada Lovelace was an English mathematician and writer, chiefly known for her work on Charles Babbage's "
        "proposed mechanical general-purpose computer, the Analytical Engine.")),
]


def question(item_id, query, answers, source=None):
    meta = {"answers": answers, "passage_id": source} if answers else {"answers": [], "unanswerable": True}
    return EvalItem(id=item_id, prompt=query, query=query, reference="", meta=meta)


ITEMS = [
    question("born", "Where was Marie Curie born?", ["Warsaw"], "curie"),
    # The answer is in the kept passage but not in the sentence that answers the question best.
    question("elsewhere", "Where was Marie Curie born?", ["radioactivity"], "curie"),
    question("django", "How do I turn on CSRF protection in Django's settings.py?", []),
]


@pytest.fixture(scope="module")
def index(tiny_lm):
    return NestIndex.build(PASSAGES, tiny_lm, show_progress=False)


def rows(report):
    return {row["item_id"]: row for row in report["items"]}


def test_the_answer_is_in_the_planned_window_only_where_the_window_holds_it(index):
    report = domain_report(index, ITEMS, NestConfig(max_new_tokens=64, answer_windows=1, fill_windows=0))
    born, elsewhere, django = (rows(report)[i] for i in ("born", "elsewhere", "django"))
    assert born["kept"] and born["kept"][0] == "curie" and born["source_kept"]
    assert [w["passage_id"] for w in born["windows"]] == ["curie"]
    assert elsewhere["planned_text"] == born["planned_text"] and born["answer_kept"] and elsewhere["answer_kept"]
    # One window of one of the two sentences: the answer of exactly one item is in it, and recall says which.
    for row in (born, elsewhere):
        assert row["window_recall"] == float(row["answers"][0] in row["planned_text"])
    assert born["window_recall"] + elsewhere["window_recall"] == 1.0
    assert django["unanswerable"] and not django["kept_any"] and not django["windows"]
    assert report["summary"] == {
        "items": 3, "answerable": 2, "planned": 2, "window_recall": 1, "window_recall_rate": 0.5,
        "answer_retrieved": 2, "answer_kept": 2, "with_source": 2, "source_kept": 2, "unanswerable": 1, "unanswerable_kept": 0,
    }


def test_the_token_budget_cuts_the_planned_text(index):
    full = rows(domain_report(index, ITEMS[:1], NestConfig(max_new_tokens=64, answer_windows=1, fill_windows=0)))["born"]
    cut = rows(domain_report(index, ITEMS[:1], NestConfig(max_new_tokens=3, answer_windows=1, fill_windows=0)))["born"]
    assert full["planned_tokens"] > 3 and cut["planned_tokens"] == 3
    assert full["planned_text"].startswith(cut["planned_text"]) and "Warsaw" not in cut["planned_text"]
    assert cut["window_recall"] == 0.0 and cut["answer_kept"]


def test_the_report_is_written_as_json_and_a_table(index, tmp_path):
    config = NestConfig(max_new_tokens=64, answer_windows=1, fill_windows=0)
    domain = {"passages": len(PASSAGES), **domain_report(index, ITEMS, config)}
    write_window_bench({"toy": domain}, config, index.lm.name, tmp_path)
    saved = json.loads((tmp_path / "windows.json").read_text())
    assert saved["domains"]["toy"]["summary"]["window_recall"] == 1
    assert saved["config"]["max_new_tokens"] == 64
    table = (tmp_path / "README.md").read_text()
    assert "| toy | 3 passages | 2 | 1 of 2 | 0.500 |" in table and "0 of 1" in table


def test_an_unknown_domain_fails_before_loading_anything():
    result = CliRunner().invoke(app, ["bench", "windows", "--domain", "bio"])
    assert result.exit_code == 2 and "unknown --domain bio" in result.output


def test_a_chunking_a_domain_does_not_have_fails_before_loading_anything():
    result = CliRunner().invoke(app, ["bench", "windows", "--domain", "docs", "--docs-chunking", "sentence"])
    assert result.exit_code == 2 and "unknown --docs-chunking 'sentence' for docs" in result.output


def test_a_window_that_announces_what_follows_runs_on_into_the_next_chunk_to_its_sections_end(tiny_lm):
    """A window ending "...as follows:" does not close the answer: the planned text goes on past
    its passage's end into the next chunk of its document and stops where that chunk's next
    section begins, as the decoder's copy does."""
    first = "## Limits\n\nTo cap the body size, set the option as follows:\n"
    second = "\n```js\nfastify({ bodyLimit: 1048576 })\n```\n\n## Logging\n\nThe logger writes JSON lines.\n"
    chunks = [Passage(id="srv#0", text=first, doc_id="srv"), Passage(id="srv#1", text=second, doc_id="srv", doc_char_start=len(first))]
    index = NestIndex.build(chunks, tiny_lm, show_progress=False)
    item = question("limit", "How do I cap the body size?", ["bodyLimit: 1048576"], "srv#0")
    row = item_row(index, item, NestConfig(max_new_tokens=64, min_passage_relevance=-1.0))
    assert [w["passage_id"] for w in row["windows"]][-2:] == ["srv#0", "srv#1"] and row["window_recall"] == 1.0, row
    assert "as follows:\n" in row["planned_text"] and "Logging" not in row["planned_text"] and "JSON" not in row["planned_text"]


def test_windows_of_two_passages_are_joined_by_a_paragraph_break(index):
    # Planned text as the decoder writes it: a window that would run into the one before gets a
    # break first ("...radioactivity.Alan Turing" would hide a gold answer's word boundary).
    row = rows(domain_report(index, [question("two", "Who were Marie Curie and Alan Turing?", ["Turing"])], NestConfig(max_new_tokens=96, answer_windows=2)))["two"]
    sources = {w["passage_id"] for w in row["windows"]}
    assert len(sources) == 2
    text = row["planned_text"]
    assert "\n\n" in text and not any(text[i] in ".!?" and text[i + 1].isalpha() for i in range(len(text) - 1))
