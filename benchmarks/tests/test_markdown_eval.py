"""Tests for the markdown-docs evaluation domains: the bundled Fastify docs and the second
domain's Pino docs, their questions, the tasks' items, and the repetition, copied-markup and
unanswerable metrics."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from nest_benchmarks.markdown_docs import (
    FASTIFY_DOCS_DIR,
    FASTIFY_QA_PATH,
    MARKDOWN_CHUNKINGS,
    PINO_DOCS_DIR,
    PINO_QA_PATH,
    fastify_documents,
    markdown_passages,
    pino_documents,
)
from nest_benchmarks.metrics import (
    copied_markup,
    is_repetitive,
    markup_ranges,
    recopied_source,
    repeated_ngram,
    unanswerable_scores,
)
from nest_benchmarks.runner import (
    docs_domain_passages,
    load_items,
    run_eval,
    score_item,
    summarize_records,
)
from nest_benchmarks.tasks import (
    MARKDOWN_QA_KINDS,
    QA_TASKS,
    TASK_MAX_NEW_TOKENS,
    markdown_docs_items,
    markdown_docs_pino_items,
    markdown_qa_items,
)
from nest_integrations.cli.common import passages_fingerprint
from nest_integrations.decoding.output import document_name
from nest_integrations.index.nest_index import NestIndex



def _records(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


RECORDS = _records(FASTIFY_QA_PATH)
PINO_RECORDS = _records(PINO_QA_PATH)


# --------------------------------------------------------------------------- corpus and questions


def test_corpus_is_the_unmodified_package_files():
    documents = fastify_documents()
    assert len(documents) == 14 and [d.id for d in documents] == sorted(d.id for d in documents)
    for document in documents:
        assert document.text == (FASTIFY_DOCS_DIR / document.id).read_text(encoding="utf-8")
        assert document.metadata["package"] == "fastify@5.12.8"
        # a citation names the file, not the package, and finds its lines there
        assert document_name(document.metadata, document.id) == document.metadata["path"]
    assert "MIT License" in (FASTIFY_DOCS_DIR.parent / "LICENSE").read_text()
    assert (FASTIFY_DOCS_DIR.parent / "SOURCE.md").exists()
    assert 250_000 <= sum(len(d.text.encode()) for d in documents) <= 350_000


@pytest.mark.parametrize(
    "docs_dir, record",
    [(FASTIFY_DOCS_DIR, r) for r in RECORDS] + [(PINO_DOCS_DIR, r) for r in PINO_RECORDS],
    ids=[f"fastify-{r['id']}" for r in RECORDS] + [f"pino-{r['id']}" for r in PINO_RECORDS],
)
def test_every_gold_answer_occurs_verbatim_in_its_document(docs_dir, record):
    if record["kind"] == "unanswerable":
        assert record["answers"] == [] and record["doc"] is None and record["unanswerable"] is True
        return
    text = (docs_dir / record["doc"]).read_text(encoding="utf-8")
    for answer in record["answers"]:
        assert answer in text, f"{answer!r} is not in {record['doc']}"


def test_question_mix():
    kinds = [r["kind"] for r in RECORDS]
    assert len(RECORDS) == 40 and len({r["id"] for r in RECORDS}) == 40
    assert kinds.count("howto") >= 24 and kinds.count("followup") >= 6 and kinds.count("unanswerable") >= 8
    assert len({r["doc"] for r in RECORDS if r["doc"]}) >= 10  # spread over the files


def test_pino_corpus_is_the_whole_docs_folder_unmodified():
    documents = pino_documents()
    assert [d.id for d in documents] == sorted(p.name for p in PINO_DOCS_DIR.glob("*.md")) and len(documents) == 14
    for document in documents:
        assert document.text == (PINO_DOCS_DIR / document.id).read_text(encoding="utf-8")
        assert document.metadata["package"] == "pino@10.4.0"
        assert document_name(document.metadata, document.id) == document.metadata["path"]
    assert "MIT License" in (PINO_DOCS_DIR.parent / "LICENSE").read_text()
    assert "pino@10.4.0" in (PINO_DOCS_DIR.parent / "SOURCE.md").read_text()
    assert 150_000 <= sum(len(d.text.encode()) for d in documents) <= 170_000


# What each unanswerable Pino question hinges on: in the question, nowhere in the docs.
PINO_UNANSWERED_TERMS = {
    "unanswerable-winston-rotate": "winston-daily-rotate-file",
    "unanswerable-sample-rate": "sampleRate",
    "unanswerable-python": "Django",
    "unanswerable-logback": "Logback",
    "unanswerable-encrypt": "encryptAtRest",
    "unanswerable-splunk-hec": "Splunk",
    "unanswerable-go-slog": "log/slog",
    "unanswerable-colorize-errors": "colorizeStack",
}


def test_pino_question_mix():
    kinds = [r["kind"] for r in PINO_RECORDS]
    assert len(PINO_RECORDS) == 40 and len({r["id"] for r in PINO_RECORDS}) == 40
    assert kinds.count("howto") >= 24 and kinds.count("followup") >= 4 and kinds.count("unanswerable") == 8
    assert len({r["doc"] for r in PINO_RECORDS if r["doc"]}) >= 8  # spread over the files
    # several answers are a function's or option's name that stands in a heading
    headings = {
        name: [line for line in (PINO_DOCS_DIR / name).read_text().splitlines() if line.startswith("#")]
        for name in {r["doc"] for r in PINO_RECORDS if r["doc"]}
    }
    in_heading = [r for r in PINO_RECORDS if r["doc"] and any(f"`{a}`" in h or f".{a}(" in h
                                                                for a in r["answers"] for h in headings[r["doc"]])]
    assert len(in_heading) >= 8


def test_pino_unanswerable_questions_name_what_the_docs_lack():
    corpus = "\n".join(d.text for d in pino_documents()).lower()
    unanswerable = {r["id"]: r["question"] for r in PINO_RECORDS if r["kind"] == "unanswerable"}
    assert set(unanswerable) == set(PINO_UNANSWERED_TERMS)
    for record_id, term in PINO_UNANSWERED_TERMS.items():
        assert term in unanswerable[record_id]
        assert not re.search(rf"(?<![\w-]){re.escape(term.lower())}(?![\w-])", corpus), term


@pytest.mark.parametrize("chunking", MARKDOWN_CHUNKINGS)
def test_every_chunking_keeps_document_offsets(chunking):
    documents = {d.id: d.text for d in fastify_documents()}
    passages = markdown_passages(chunking)
    assert len(passages) > len(documents)  # the large files are cut
    for passage in passages:
        assert documents[passage.doc_id][passage.doc_char_start : passage.doc_char_end] == passage.text
    assert passages_fingerprint(passages) == passages_fingerprint(markdown_passages(chunking))


def test_a_cached_index_is_rebuilt_when_its_passages_metadata_change():
    passages = markdown_passages("cli")[:3]
    moved = [replace(passages[0], metadata={**passages[0].metadata, "path": "elsewhere/Reply.md"}), *passages[1:]]
    assert passages_fingerprint(moved) != passages_fingerprint(passages)
    assert passages_fingerprint(passages) == passages_fingerprint(list(passages))


def test_unknown_chunking_is_named():
    with pytest.raises(ValueError, match="'paragraph'"):
        markdown_passages("paragraph")
    with pytest.raises(ValueError, match="'express'"):
        markdown_passages("cli", "express")


def test_pino_task_is_a_markdown_domain_of_its_own():
    assert "markdown-docs-pino" in QA_TASKS and TASK_MAX_NEW_TOKENS["markdown-docs-pino"] == 64
    items = load_items("markdown-docs-pino")
    assert [i.id for i in items] == [r["id"] for r in PINO_RECORDS] == [i.id for i in markdown_docs_pino_items()]
    drawn = markdown_docs_pino_items(12, seed=3)
    assert len(drawn) == 12 and {i.meta["kind"] for i in drawn} == set(MARKDOWN_QA_KINDS)
    passages = docs_domain_passages("markdown-docs-pino", "splitter")
    assert {p.doc_id for p in passages} == {d.id for d in pino_documents()}
    texts = {d.id: d.text for d in pino_documents()}
    for passage in passages:
        assert texts[passage.doc_id][passage.doc_char_start : passage.doc_char_end] == passage.text


# --------------------------------------------------------------------------- items


def test_items_of_every_kind():
    items = markdown_docs_items()
    assert [i.id for i in items] == [r["id"] for r in RECORDS]
    by_kind = {kind: [i for i in items if i.meta["kind"] == kind] for kind in MARKDOWN_QA_KINDS}
    for item in by_kind["howto"]:
        assert item.prompt == item.query and item.meta["answers"] and item.meta["passage_id"].endswith(".md")
    for item in by_kind["followup"]:
        first, answer, last = item.prompt
        assert (first["role"], answer["role"], last["role"]) == ("user", "assistant", "user")
        # retrieval searches the earlier question too: "And how do I remove it?" alone names nothing
        assert item.query == f"{first['content']}\n{last['content']}"
    for item in by_kind["unanswerable"]:
        assert item.meta["unanswerable"] and item.meta["answers"] == [] and "passage_id" not in item.meta


def test_a_small_draw_keeps_every_kind_and_is_deterministic():
    drawn = markdown_docs_items(12, seed=3)
    assert len(drawn) == 12 and {i.meta["kind"] for i in drawn} == set(MARKDOWN_QA_KINDS)
    assert [i.id for i in drawn] == [i.id for i in markdown_docs_items(12, seed=3)]
    assert [i.id for i in drawn] != [i.id for i in markdown_docs_items(12, seed=4)]
    with pytest.raises(ValueError, match="41"):
        markdown_docs_items(41)


GOOD = {"id": "q", "question": "How?", "answers": ["x"], "doc": "Reply.md", "kind": "howto"}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kind": "trivia"}, "'kind'"),
        ({"answers": []}, "gold 'answers'"),
        ({"doc": None}, "'doc'"),
        ({"kind": "unanswerable", "unanswerable": True}, "'answers': \\[\\]"),
        ({"kind": "unanswerable", "answers": [], "doc": None}, "'unanswerable'"),
        ({"kind": "followup"}, "'messages'"),
        ({"kind": "followup", "messages": [{"role": "user", "content": "Hi"}]}, "assistant"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}, "only for a followup"),
        ({"question": " "}, "'question'"),
    ],
)
def test_bad_records_name_the_field(tmp_path, change, message):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({**GOOD, **change}) + "\n")
    with pytest.raises(ValueError, match=message):
        markdown_qa_items(path)


def test_an_unanswerable_question_may_follow_a_conversation(tmp_path):
    """A question the documents do not answer, asked after an exchange, keeps that exchange:
    its prompt is the conversation and its retrieval query reads the earlier question too."""
    path = tmp_path / "qa.jsonl"
    history = [{"role": "user", "content": "How does the client log in over SSH?"}, {"role": "assistant", "content": "It runs a helper."}]
    path.write_text(json.dumps({
        "id": "u", "kind": "unanswerable", "unanswerable": True, "question": "Is there a pure-SSH mode too?",
        "answers": [], "doc": None, "messages": history,
    }) + "\n")
    (item,) = markdown_qa_items(path)
    assert item.prompt == [*history, {"role": "user", "content": "Is there a pure-SSH mode too?"}]
    assert "log in over SSH" in item.query and item.meta["unanswerable"]


def test_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text((json.dumps(GOOD) + "\n") * 2)
    with pytest.raises(ValueError, match="duplicate id 'q'"):
        markdown_qa_items(path)


# --------------------------------------------------------------------------- metrics on hand-made outputs


def _output(pieces, attribution=0.5):
    """An output dict from ``(text, source)`` pieces; ``source`` is None for LM text or
    ``(passage id, chunk_char_start)`` for a copy."""
    spans, text = [], ""
    for piece, source in pieces:
        span = {"text": piece, "start": len(text), "end": len(text) + len(piece), "copied": source is not None,
                "source": None}
        if source is not None:
            span["source"] = {"id": source[0], "chunk_char_start": source[1], "chunk_char_end": source[1] + len(piece)}
        spans.append(span)
        text += piece
    return {"text": text, "spans": spans, "attribution_ratio": attribution, "mean_copied_span_tokens": 2.0,
            "stats": {"new_tokens": 10, "forward_passes": 4, "wall_s": 1.0, "retrieval_s": 0.1,
                      "encode_s": 0.1, "decode_s": 0.8}}


def test_repeated_ngram_flags_loops_only():
    assert repeated_ngram("Use reply.hijack() to stop. Use reply.hijack() to stop. Use reply.hijack() to stop.")
    assert repeated_ngram("a a a a a a")  # overlapping occurrences count
    assert not repeated_ngram("Use reply.hijack() to stop. Use reply.hijack() to stop.")  # twice is not a loop
    assert not repeated_ngram("reply.header('x-foo', 'foo') and reply.header('x-bar', 'bar') and reply.header('x-baz')")
    with pytest.raises(ValueError, match="n and times"):
        repeated_ngram("text", n=0)


PASSAGE = "Call reply.removeHeader('set-cookie') to reset the header before sending anything."


def test_recopied_source_in_passage_and_document_coordinates():
    twice = _output([(PASSAGE[:40], ("p", 0)), (" and ", None), (PASSAGE[:40], ("p", 0))])
    assert recopied_source(twice) and is_repetitive(twice)
    short = _output([(PASSAGE[:40], ("p", 0)), (" ", None), (PASSAGE[30:50], ("p", 30))])
    assert not recopied_source(short)  # 10 shared characters, below 16
    # two overlapping chunks of one document: chunk "d#1" starts at character 20 of "d"
    across = _output([(PASSAGE[20:60], ("d#0", 20)), (" ", None), (PASSAGE[20:60], ("d#1", 0))])
    assert not recopied_source(across)
    assert recopied_source(across, {"d#0": ("d", 0), "d#1": ("d", 20)})
    clean = _output([(PASSAGE[:40], ("p", 0)), (PASSAGE[40:], ("p", 40))])
    assert not is_repetitive(clean)


CHANGELOG = (
    "* allow a default of 0 ([#1](https://github.com/yargs/yargs/issues/1))\n"
    "* keep the order of commands ([#2](https://github.com/yargs/yargs/issues/2))\n"
    "* strip dashes from aliases ([#3](https://github.com/yargs/yargs/issues/3))\n"
)


def test_a_repetition_its_sources_make_is_not_a_loop():
    """Three changelog entries copied from three places each end in a link to the issues: the
    changelog's repetition, not the answer's. Written by the model, or copied from one place
    again and again, the same lines are a loop."""
    lines = CHANGELOG.splitlines(keepends=True)
    starts = [CHANGELOG.index(line) for line in lines]
    copied = _output([(line, ("changelog", start)) for line, start in zip(lines, starts)])
    assert repeated_ngram(copied["text"]) and not is_repetitive(copied)
    assert is_repetitive(_output([(CHANGELOG, None)]))  # the model wrote them
    once_then_written = _output([(lines[0], ("changelog", 0)), (lines[1] + lines[2], None)])
    assert is_repetitive(once_then_written)  # copied once, the model repeats the links twice
    same_place = _output([(lines[0], ("changelog", 0)), (lines[0], ("changelog", 0)), (lines[0], ("changelog", 0))])
    assert is_repetitive(same_place)


MARKDOWN = (
    "---\ntitle: Reply\n---\n"
    "## Reply\n"
    "<a id=\"code\"></a>\n\n"
    "If not set, the `statusCode` will be `200`.\n"
    "<!-- hidden note -->\n"
    "[1]: https://example.com/ajv\n\n"
    "```sh\n# install it\nnpm i fastify\n```\n"
    "A type like Array<string> is no tag.\n"
)


@pytest.mark.parametrize(
    "copied, kinds",
    [
        ("If not set, the `statusCode` will be `200`.", []),
        ("title: Reply\n---\n", ["front_matter"]),
        ("## Reply\n", ["heading"]),
        ("id=\"code\"></a>\n\nIf not set", ["html_tag"]),  # half an anchor counts
        ("`200`.\n<!-- hidden", ["html_comment"]),
        ("[1]: https://example.com/ajv", ["link_definition"]),
        ("# install it\nnpm i fastify", []),  # a shell comment inside a code fence is no heading
        ("A type like Array<string> is no tag.", []),
    ],
)
def test_copied_markup_kinds(copied, kinds):
    start = MARKDOWN.index(copied)
    output = _output([("Answer: ", None), (copied, ("r", start))])
    assert copied_markup(output, {"r": MARKDOWN}) == kinds


def test_a_heading_title_without_its_marks_is_no_markup():
    """The title an answer carries as the label of the section it copies is what a reader sees."""
    start = MARKDOWN.index(" Reply\n<a")
    assert copied_markup(_output([(" Reply", ("r", start))]), {"r": MARKDOWN}) == []
    assert copied_markup(_output([("## Reply", ("r", start - 2))]), {"r": MARKDOWN}) == ["heading"]


def test_markup_the_lm_writes_or_from_unknown_sources_does_not_count():
    written = _output([("## Reply\n<a id=\"x\"></a>", None)])
    assert copied_markup(written, {"r": MARKDOWN}) == []
    unknown = _output([("## Reply\n", ("elsewhere", 0))])
    assert copied_markup(unknown, {"r": MARKDOWN}) == []
    assert [kind for _, _, kind in markup_ranges("# Title\ntext")] == ["heading"]


def test_unanswerable_scores():
    assert unanswerable_scores(_output([("x", None)], attribution=0.0), True) == {
        "cited_unanswerable": False, "unanswerable_attribution": 0.0}
    assert unanswerable_scores(_output([("x", ("p", 0))], attribution=0.4), True) == {
        "cited_unanswerable": True, "unanswerable_attribution": 0.4}
    assert unanswerable_scores(_output([("x", None)]), False) == {
        "cited_unanswerable": None, "unanswerable_attribution": None}


def test_score_item_and_summary_for_markdown_items():
    items = {i.id: i for i in markdown_docs_items()}
    passages = {"Reply.md": MARKDOWN}
    copy = _output([("## Reply\n", ("Reply.md", MARKDOWN.index("## Reply")))], attribution=1.0)
    unanswerable = score_item(items["unanswerable-graphql"], copy, "markdown-docs", passages)
    assert unanswerable["answer_recall"] is None and unanswerable["cited_unanswerable"] is True
    assert unanswerable["markup_copied"] is True and unanswerable["copied_markup"] == ["heading"]
    answered = score_item(items["howto-redirect-default"], _output([("It sends 302.", None)], 0.0), "markdown-docs", passages)
    assert answered["answer_recall"] == 1.0 and answered["cited_unanswerable"] is None
    see_also = _output([("The documents do not cover this question.\nSee also: reply.md (302 redirects).", None)], 0.0)
    see_also["stats"]["finish_reason"] = "not_covered"
    abstained = score_item(items["howto-redirect-default"], see_also, "markdown-docs", passages)
    assert abstained["answer_recall"] == 0.0, "an abstention answers nothing, whatever the titles it names"
    assert answered["markup_copied"] is False and answered["repetitive"] is False
    records = [{"mode": mode, "condition": "present", "metrics": {**metrics, "wall_s": wall}}
               for mode, metrics, wall in (("rag", answered, 2.0), ("nest", unanswerable, 1.0))]
    nest = summarize_records(records, "markdown-docs", ("rag", "nest"), ("present",))[1]
    assert nest["speedup_vs_rag"] == pytest.approx(2.0) and nest["speedup_vs_base"] is None
    assert nest["cited_unanswerable"] == 1.0 and nest["answer_recall"] is None


# --------------------------------------------------------------------------- a run end to end


def test_markdown_docs_run(tiny_lm, tmp_path):
    gold_docs = {item.meta.get("passage_id") for item in markdown_docs_items(3)}
    passages = [p for p in markdown_passages("sentence") if p.doc_id in gold_docs]  # a small index builds fast
    index = NestIndex.build(passages, tiny_lm, show_progress=False)
    summary = run_eval(index, "markdown-docs", n=3, modes=("rag", "nest"), max_new_tokens=6, out_dir=tmp_path,
                       config_overrides={"min_passage_relevance": -1.0}, show_progress=False)
    assert summary["n_items"] == 3 and summary["conditions"] == ["present"]
    records = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert {r["meta"]["kind"] for r in records} == set(MARKDOWN_QA_KINDS)
    followup = next(r for r in records if r["meta"]["kind"] == "followup")
    assert isinstance(followup["prompt"], list) and followup["prompt"][-1]["role"] == "user"
    for row in summary["results"]:
        for key in ("repetitive", "markup_copied", "cited_unanswerable", "speedup_vs_rag"):
            assert row[key] is not None and 0.0 <= row[key]
    table = (tmp_path / "summary.md").read_text()
    for header in ("repetition", "markup copied", "cited on unanswerable", "speed vs rag"):
        assert header in table
