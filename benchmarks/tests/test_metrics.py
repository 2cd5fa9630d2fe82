"""Tests for nest_benchmarks.metrics on hand-made cases."""

from __future__ import annotations

import math

import pytest

from nest_benchmarks.metrics import (
    aggregate,
    answer_recall,
    copied_markup,
    fragment_answer,
    garbled_model_text,
    markup_ranges,
    model_text_in_code,
    normalize_answer,
    opens_with_entity,
    opens_with_other_name,
    rouge_scores,
    seam_ok,
    seam_ok_rate,
    span_integrity,
    spans_tile_text,
    tokens_per_forward,
    year_precision,
    years,
)

# --------------------------------------------------------------------------- ROUGE / years


def test_rouge_identical_is_one_and_disjoint_is_zero() -> None:
    text = "Marie Curie was a physicist and chemist."
    assert rouge_scores(text, text) == {"rouge1": pytest.approx(1.0), "rougeL": pytest.approx(1.0)}
    assert rouge_scores("apples oranges bananas", "quantum chromodynamics lattice") == {
        "rouge1": 0.0,
        "rougeL": 0.0,
    }


def test_rouge_uses_stemmer_and_handles_empty() -> None:
    assert rouge_scores("running dogs", "run dog")["rouge1"] == pytest.approx(1.0)
    assert rouge_scores("", "something") == {"rouge1": 0.0, "rougeL": 0.0}
    assert rouge_scores("something", "   ") == {"rouge1": 0.0, "rougeL": 0.0}
    partial = rouge_scores("the cat sat", "the cat ran")
    assert 0.0 < partial["rouge1"] < 1.0


def test_years_word_bounded_range() -> None:
    assert years("Born 1867, died 1934 (1867–1934); in 2001 and 2099.") == [
        "1867", "1934", "1867", "1934", "2001", "2099",
    ]
    assert years("the 1860s, 999 BC, 2100, 12345, AD1500, 0999") == []


def test_year_precision() -> None:
    assert year_precision("Born in 1867, died in 1999.", "She was born in 1867.") == 0.5
    assert year_precision("No dates here.", "Born 1867.") is None
    assert year_precision("1867 1867 1867 1999", "1867") == 0.5  # distinct years
    assert year_precision("In 1903 she won.", "") == 0.0


# --------------------------------------------------------------------------- QA


def test_normalize_answer() -> None:
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("An apple, a day.") == "apple day"
    assert normalize_answer("ＡＢＣ") == "abc"  # NFKC full-width
    assert normalize_answer("«Curie»") == "curie"  # unicode punctuation
    assert normalize_answer("Jean-Paul Sartre") == "jean paul sartre"
    assert normalize_answer("1867–1934") == "1867 1934"
    assert normalize_answer("Theory") == "theory"  # 'the' only as a whole word


def test_answer_recall() -> None:
    assert answer_recall("It is in Paris, France.", ["paris"]) == 1.0
    assert answer_recall("The winner was THE Beatles!", ["Beatles"]) == 1.0
    assert answer_recall("Capital: ＰＡＲＩＳ", ["Paris"]) == 1.0
    assert answer_recall("She lived 1867–1934.", ["1867"]) == 1.0
    assert answer_recall("We went to a party.", ["art"]) == 0.0  # whole tokens only
    assert answer_recall("It is Lyon.", ["Paris", "Lyon"]) == 1.0
    assert answer_recall("It is Lyon.", ["Paris"]) == 0.0


def test_answer_recall_finds_identifiers_in_code() -> None:
    assert normalize_answer("sort_keys=True", split_punctuation=True) == "sort keys true"
    assert answer_recall("Call json.dumps(d, sort_keys=True).", ["sort_keys"]) == 1.0
    assert answer_recall("Use `json.loads(s)`.", ["loads"]) == 1.0
    assert answer_recall("maxsize=128 by default", ["128"]) == 1.0
    assert answer_recall("Use json.dumps.", ["loads"]) == 0.0
    assert answer_recall("Use heappushpop.", ["heappush"]) == 0.0  # still whole identifiers


def test_answer_recall_rejects_empty_answers() -> None:
    with pytest.raises(ValueError):
        answer_recall("anything", [])
    with pytest.raises(ValueError):
        answer_recall("anything", ["the", "  "])


# --------------------------------------------------------------------------- entities


@pytest.mark.parametrize(
    ("prediction", "name"),
    [
        ("Marie Curie was a physicist.", "Marie Curie"),
        ("marie curie (born 1867) was a physicist.", "Marie Curie"),
        ("Curie was a Polish-French physicist.", "Marie Curie"),
        ("Sure! Here is a short bio of Marie Curie: she was born in Warsaw.", "Marie Curie"),
        ("Hans Krebs was a biochemist.", "Hans Krebs (biochemist)"),
        ("Constantin Brancusi was a sculptor.", "Constantin Brâncuși"),
        ("Johann Strauss's waltzes made him famous.", "Johann Strauss II"),
        ("Baybars was a sultan.", "Baybars"),
        ("T. S. Eliot was a poet.", "T. S. Eliot"),
        ("**Marie Curie** was a physicist.", "Marie Curie"),
        (
            "Marie Curie (born Maria Salomea Skłodowska; 7 November 1867 – 4 July 1934 in "
            "Passy, Haute-Savoie, France) was a physicist.",
            "Marie Curie",
        ),
    ],
)
def test_opens_with_entity_positive(prediction: str, name: str) -> None:
    assert opens_with_entity(prediction, name)


@pytest.mark.parametrize(
    ("prediction", "name", "window"),
    [
        ("Albert Einstein was a physicist.", "Marie Curie", 12),
        ("Marie Antoinette was a queen.", "Marie Curie", 12),  # first name only
        ("Baybarsid rule lasted long.", "Baybars", 12),
        ("The discovery of radium in 1898 changed physics, and Curie won.", "Marie Curie", 5),
        ("", "Marie Curie", 12),
    ],
)
def test_opens_with_entity_negative(prediction: str, name: str, window: int) -> None:
    assert not opens_with_entity(prediction, name, window=window)


@pytest.mark.parametrize(
    ("prediction", "name"),
    [
        ("Albert Einstein was a German-born physicist.", "Marie Curie"),
        ("Pierre Curie was a French physicist.", "Marie Curie"),  # relative, not a sub-span
        ("The physicist Albert Einstein is famous.", "Marie Curie"),
        ("Leonardo da Vinci (1452–1519) was a painter.", "Michelangelo Buonarroti"),
        ("Sir Isaac Newton was a mathematician.", "Gottfried Wilhelm Leibniz"),
        ("**Albert Einstein** (1879–1955) was a physicist.", "Marie Curie"),  # Markdown
    ],
)
def test_opens_with_other_name_positive(prediction: str, name: str) -> None:
    assert opens_with_other_name(prediction, name)


@pytest.mark.parametrize(
    ("prediction", "name"),
    [
        ("Marie Curie was a physicist.", "Marie Curie"),
        ("Marie Skłodowska Curie was a physicist.", "Marie Curie"),  # target is a subsequence
        ("Sir Isaac Newton was a mathematician.", "Isaac Newton"),
        ("Hans Krebs was a biochemist.", "Hans Adolf Krebs"),  # sub-span of target
        ("Curie was a physicist.", "Marie Curie"),  # single capitalised word: no name
        ("She was a physicist born in Warsaw, Poland.", "Marie Curie"),
        ("In Paris, Marie Curie met Pierre Curie.", "Marie Curie"),
        ("Sure! Here is a bio of Marie Curie.", "Marie Curie"),
        ("T. S. Eliot was a poet.", "T. S. Eliot"),
        ("Albert Einstein and Marie Curie were friends.", "Marie Curie"),  # target present
        ("**Marie Curie** (1867–1934) was a physicist.", "Marie Curie"),
        ("Maria Skłodowska-Curie, better known as Marie Curie, was a physicist.", "Marie Curie"),
        ("Dr. Marie Curie was a physicist.", "Marie Curie"),
        ("The physicist was born in Warsaw. Albert Einstein", "Marie Curie"),  # after verb
        ("", "Marie Curie"),
    ],
)
def test_opens_with_other_name_negative(prediction: str, name: str) -> None:
    assert not opens_with_other_name(prediction, name)


def test_entity_checks_validate_inputs() -> None:
    with pytest.raises(ValueError):
        opens_with_entity("text", "Marie Curie", window=0)
    with pytest.raises(ValueError):
        opens_with_other_name("text", "(disambiguation)")


# --------------------------------------------------------------------------- output contract

PASSAGES = {
    "curie": "Intro. Marie Curie was a Polish and naturalised-French physicist and chemist.",
}


def _output() -> dict:
    """A valid generation output: one generated span, one copied span."""
    source_text = PASSAGES["curie"]
    copied = "Marie Curie was a Polish"
    char_start = source_text.index(copied)
    prefix = "Answer: "
    suffix = " scientist."
    text = prefix + copied + suffix
    return {
        "text": text,
        "mode": "nest",
        "spans": [
            {"text": prefix, "start": 0, "end": len(prefix), "copied": False, "source": None},
            {
                "text": copied,
                "start": len(prefix),
                "end": len(prefix) + len(copied),
                "copied": True,
                "source": {"id": "curie", "title": "Marie Curie", "metadata": {},
                           "chunk_char_start": char_start, "chunk_char_end": char_start + len(copied)},
            },
            {"text": suffix, "start": len(prefix) + len(copied), "end": len(text),
             "copied": False, "source": None},
        ],
    }


def test_span_integrity_valid_and_no_copied_spans() -> None:
    assert span_integrity(_output(), PASSAGES) == 1.0
    generated_only = {"text": "abc", "spans": [{"text": "abc", "start": 0, "end": 3,
                                                "copied": False, "source": None}]}
    assert span_integrity(generated_only, PASSAGES) == 1.0


def test_span_integrity_catches_doctored_text() -> None:
    output = _output()
    span = output["spans"][1]
    doctored = span["text"][:-1] + "X"
    span["text"] = doctored
    output["text"] = output["text"][: span["start"]] + doctored + output["text"][span["end"]:]
    assert spans_tile_text(output)  # still tiles: only the source check catches it
    assert span_integrity(output, PASSAGES) == 0.0


def test_span_integrity_catches_wrong_offsets_and_sources() -> None:
    output = _output()
    output["spans"][1]["source"]["chunk_char_start"] += 1
    assert span_integrity(output, PASSAGES) == 0.0

    output = _output()
    output["spans"][1]["source"]["id"] = "unknown"
    assert span_integrity(output, PASSAGES) == 0.0

    output = _output()
    output["spans"][1]["start"] += 1  # output-text location wrong
    assert span_integrity(output, PASSAGES) == 0.0

    output = _output()
    second = dict(output["spans"][1], source=dict(output["spans"][1]["source"], chunk_char_end=-1))
    output["spans"].append(second)
    assert span_integrity(output, PASSAGES) == 0.5


def test_outputs_saved_by_0_1_with_only_the_old_offset_keys_score_the_same() -> None:
    """Outputs saved by 0.1 before its chunk offsets were renamed hold only ``char_start`` / ``char_end``."""
    output = _output()
    source = output["spans"][1]["source"]
    source["char_start"], source["char_end"] = source.pop("chunk_char_start"), source.pop("chunk_char_end")
    assert span_integrity(output, PASSAGES) == 1.0
    source["char_start"] += 1
    assert span_integrity(output, PASSAGES) == 0.0


def test_span_integrity_requires_spans() -> None:
    with pytest.raises(ValueError):
        span_integrity({"text": "abc"}, PASSAGES)


def test_spans_tile_text() -> None:
    assert spans_tile_text(_output())
    assert spans_tile_text({"text": "", "spans": []})
    assert not spans_tile_text({"text": "abc", "spans": []})

    gap = _output()
    del gap["spans"][1]
    assert not spans_tile_text(gap)

    short = _output()
    short["spans"] = short["spans"][:-1]
    assert not spans_tile_text(short)

    wrong_text = _output()
    wrong_text["spans"][0]["text"] = "Answer! "
    assert not spans_tile_text(wrong_text)

    with pytest.raises(ValueError):
        spans_tile_text({"spans": []})


# --------------------------------------------------------------------------- speed / aggregate


def test_tokens_per_forward() -> None:
    assert tokens_per_forward({"new_tokens": 96, "forward_passes": 9}) == pytest.approx(96 / 8), "prefill excluded"
    assert tokens_per_forward({"new_tokens": 20, "forward_passes": 20}) == pytest.approx(20 / 19)
    assert tokens_per_forward({"new_tokens": 40, "forward_passes": 12}, generations=2) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        tokens_per_forward({"new_tokens": 10, "forward_passes": 0})
    with pytest.raises(ValueError):
        tokens_per_forward({"new_tokens": 10})


def test_aggregate() -> None:
    rows = [
        {"rouge1": 0.5, "year_precision": None, "opens": True},
        {"rouge1": 1.0, "year_precision": 0.5, "opens": False},
        {"rouge1": 0.0},
    ]
    result = aggregate(rows, ["rouge1", "year_precision", "opens", "missing"])
    assert result["count"] == 3
    assert result["rouge1"] == pytest.approx(0.5)
    assert result["year_precision"] == pytest.approx(0.5)
    assert result["opens"] == pytest.approx(0.5)
    assert result["missing"] is None
    assert aggregate([], ["rouge1"]) == {"count": 0, "rouge1": None}
    assert math.isnan(aggregate([{"x": float("nan")}], ["x"])["x"])
    with pytest.raises(ValueError):
        aggregate([{"x": "high"}], ["x"])
    with pytest.raises(ValueError):
        aggregate(rows, ["count"])


# --------------------------------------------------------------------------- seams

LOVELACE = ("Augusta Ada King, Countess of Lovelace (née Byron), also known as Ada Lovelace, was an English "
            "mathematician. She was the first to recognise the machine's potential; it was \"a new engine\".")


@pytest.mark.parametrize(
    ("start_at", "written", "ok"),
    [
        ("Augusta", "", True),                        # the source's start
        ("She was", "Ada wrote notes.", True),        # after a sentence end
        ("it was", "Ada saw", True),                  # after a semicolon
        (" Lovelace, was", "Ada", False),             # "Ada Lovelace, was ...": skips the subject clause
        (" Lovelace, was", "Also known as Ada", True),  # really continues what was written
        ("was an English", "Ada Lovelace", False),    # a comma after a name is no boundary
        ("Byron", "She was ", False),                 # inside the source's parenthesis
        ("new engine", "She called it", False),       # inside its quotation
        ("new engine", 'Babbage said it was "a', True),  # ... unless the text opened it too
    ],
)
def test_seam_ok(start_at: str, written: str, ok: bool) -> None:
    assert seam_ok(LOVELACE, LOVELACE.index(start_at), written) is ok


def test_seam_ok_newline_and_range() -> None:
    doc = "dumps(obj, *, indent=None)\nSerialize obj to a JSON formatted str."
    assert seam_ok(doc, doc.index("Serialize"), "Use json.dumps.")
    with pytest.raises(ValueError):
        seam_ok(doc, len(doc) + 1, "")


def _copy_output(written: str, copied: str, passage: str, source_id: str = "p") -> dict:
    start = passage.index(copied)
    spans = [{"text": written, "start": 0, "end": len(written), "copied": False, "source": None}] if written else []
    spans.append({"text": copied, "start": len(written), "end": len(written) + len(copied), "copied": True,
                  "source": {"id": source_id, "chunk_char_start": start, "chunk_char_end": start + len(copied)}})
    return {"text": written + copied, "spans": spans}


def test_seam_ok_rate() -> None:
    passages = {"p": LOVELACE}
    good = _copy_output("Ada wrote notes. ", "She was the first", LOVELACE)
    bad = _copy_output("Ada", " Lovelace, was an English", LOVELACE)
    assert seam_ok_rate(good, passages) == 1.0 and seam_ok_rate(bad, passages) == 0.0
    both = dict(bad, spans=bad["spans"] + [dict(good["spans"][1], start=len(bad["text"]))])
    assert seam_ok_rate(both, passages) == 0.5
    assert seam_ok_rate(_copy_output("Ada", " Lovelace", LOVELACE, source_id="unknown"), passages) == 0.0
    assert seam_ok_rate({"text": "Ada.", "spans": [{"text": "Ada.", "start": 0, "end": 4, "copied": False}]}, passages) is None
    with pytest.raises(ValueError):
        seam_ok_rate({"text": "x"}, passages)


def test_fragment_answer() -> None:
    assert not fragment_answer("Ada Lovelace was an English mathematician.", "Ada Lovelace")
    assert not fragment_answer("**Ada Lovelace** (1815-1852) was a mathematician.", "Ada Lovelace")
    assert not fragment_answer("\u201cThe Enchantress of Numbers\u201d, Lovelace wrote the first program.", "Ada Lovelace")
    assert fragment_answer("Aryabhaṭīya and the Arya-siddhanta.", "Aryabhata")  # never names the subject
    assert fragment_answer("1912), which gave its name to Turing's machine.", "Alan Turing")
    assert fragment_answer("was an English mathematician, Lovelace.", "Ada Lovelace")
    assert fragment_answer(", who wrote on Lovelace.", "Ada Lovelace")
    assert fragment_answer("   ", "Ada Lovelace")


def test_garbled_model_text_flags_degenerate_model_writing_but_not_copies_or_sentences():
    def output(*spans, finish="length"):
        return {"spans": [{"text": t, "copied": c} for t, c in spans], "stats": {"finish_reason": finish}}

    assert garbled_model_text(output(("```python\ndef\nread\nreadline\n(", False))) == ["```python\ndef\nread\nreadline\n("]
    assert garbled_model_text(output(("Combin a [`DefRaw`][][]. Comple a [`].", False)))
    assert garbled_model_text(output(("start of double slash double double double slash", False)))
    assert not garbled_model_text(output(("def\nread\nreadline\n(", True)))  # a copy is the source's text
    assert not garbled_model_text(output(("Use the `--port` option, as in the example below.\n- one item\n- two", False)))
    assert not garbled_model_text(output(("The documents do not cover this question.\nSee also:\na\nb\nc", False), finish="not_covered"))


def test_model_text_in_code_finds_the_lms_writing_inside_a_copied_block_but_not_fences_or_its_own_blocks():
    def output(*spans):
        starts = [sum(len(t) for t, _ in spans[:i]) for i in range(len(spans))]
        return {
            "text": "".join(t for t, _ in spans),
            "spans": [{"text": t, "start": at, "end": at + len(t), "copied": c} for (t, c), at in zip(spans, starts)],
        }

    made_up = output(("Install it:\n\n```\npip install ", True), ("--no-use-cache pip", False), ("\n```", True))
    assert model_text_in_code(made_up) == ["--no-use-cache pip"]
    # a line the copy ends, then the LM goes on with a line of its own inside the block
    assert model_text_in_code(output(("```js\nassert.throws(fn)\n", True), ("assert.notThrowing(x)\n```", False))) == [
        "assert.notThrowing(x)\n```"
    ]
    # the same in a block indented as reStructuredText writes it
    assert model_text_in_code(output(("Run::\n\n    $ borg init repo\n", True), ("    $ borg frobnicate\n", False)))
    # the decoder's fences and the indentation a copy does not bring are not the LM's writing
    assert not model_text_in_code(output(("```python\n", False), ("x = 1\n", True), ("```", False)))
    assert not model_text_in_code(output(("Example:\n\n", True), ("    ", False), ("x = 1", True)))
    # prose after a closed block, and a block the LM wrote alone, are not copied code
    assert not model_text_in_code(output(("```\nx = 1\n```\n", True), ("That sets x.", False)))
    assert not model_text_in_code(output(("```\nmade_up()\n```", False)))
    with pytest.raises(ValueError):
        model_text_in_code({"spans": []})


# --------------------------------------------------------------------------- copied markup

NOTES = (
    "It was a way to say `attrs` and `attrib`[^attr]. A class like `[^a-z]` is a regex.\n\n"
    "[^attr]: We considered calling the package `attr` too.\n"
)
TABLE = (
    "Packages\n========\n\n"
    "=========  =======\nName       Tool\n=========  =======\nAlpine     apk\n=========  =======\n"
)

CONSOLE = "Keys\n====\n\n.. code-block:: console\n\n    $ restic key list\n     ID   User\n    ------------\n    *eb78  alice\n"


@pytest.mark.parametrize(
    ("passage", "copied", "kinds"),
    [
        (NOTES, "We considered calling the package `attr` too.", []),  # a footnote's note is text
        (NOTES, "[^attr]: We considered", ["footnote"]),  # its marker is not a link definition
        (NOTES, "`attrib`[^attr]. A class", ["footnote"]),
        (NOTES, "A class like `[^a-z]` is a regex.", []),  # a code span holds no footnote
        (TABLE, "Name       Tool", []),
        (TABLE, "Tool\n=========  =======\nAlpine", ["adornment"]),  # a simple table's border
        (TABLE, "Packages\n========", ["adornment"]),
        (CONSOLE, "ID   User\n    ------------", []),  # dashes in an indented code block's output
    ],
)
def test_copied_markup_flags_footnote_markers_and_table_borders(passage: str, copied: str, kinds: list[str]) -> None:
    assert copied_markup(_copy_output("", copied, passage), {"p": passage}) == kinds


def test_a_literal_blocks_marker_is_markup_where_docutils_does_not_show_it() -> None:
    text = (
        "Run it in the mount point:\n\n::\n\n    cd /mnt/rootfs\n\nExample::\n\n    borg create repo::name .\n\n"
        "Prune as follows ::\n\n    borg prune repo\n"
    )
    found = [(lo, text[lo:hi], kind) for lo, hi, kind in markup_ranges(text)]
    example = text.index("Example::")
    assert found == [(text.index("\n::\n") + 1, "::", "explicit_markup"), (example + 8, ":", "explicit_markup"), (text.index(" ::"), " ::", "explicit_markup")]


def test_a_colon_fences_lines_are_markup_but_its_body_is_not() -> None:
    text = ":::{caution}\nA field that **lacks** a type is ignored.\n:::\n\n:::tip Use it\nText.\n:::\n\nA ratio 3:::4 is text.\n"
    assert [text[lo:hi] for lo, hi, _ in markup_ranges(text)] == [":::{caution}", ":::", ":::tip Use it", ":::"]


def test_a_myst_target_alone_is_markup_but_a_parenthesis_in_prose_is_not() -> None:
    text = "(examples-validators)=\n\n## Validators\n\nA default (the value)= is no target.\n"
    assert [(text[lo:hi], kind) for lo, hi, kind in markup_ranges(text)] == [
        ("(examples-validators)=", "explicit_markup"), ("##", "heading"),
    ]


def test_a_comment_is_markup_but_a_footnotes_note_is_not() -> None:
    text = ".. [[[cog show_help('run') ]]]\n\nRun it.\n\n.. [[[end]]] (sum: xPc0F1izoA)\n\n.. [1] A note.\n\n>>> x = 1\n... y\n"
    assert [text[lo:hi] for lo, hi, _ in markup_ranges(text)] == [".. [[[cog show_help('run') ]]]", ".. [[[end]]] (sum: xPc0F1izoA)"]


def test_markup_ranges_of_footnotes_and_simple_tables() -> None:
    assert [(NOTES[lo:hi], kind) for lo, hi, kind in markup_ranges(NOTES)] == [("[^attr]", "footnote"), ("[^attr]:", "footnote")]
    assert [TABLE[lo:hi].strip() for lo, hi, _ in markup_ranges(TABLE)] == ["========", *["=========  ======="] * 3]
    assert [kind for _, _, kind in markup_ranges("[id]: https://example.com\n")] == ["link_definition"]
