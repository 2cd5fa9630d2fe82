"""Markdown passages keep their structure: parsed blocks, hidden markup, code seams, section chunks."""

from __future__ import annotations

import re

import numpy as np
import pytest

from nest_integrations.corpus.markdown_structure import (
    copy_layout,
    copyable_tokens,
    ends_in_code,
    first_copyable,
    is_markdown,
    looks_like_markdown,
    parse_blocks,
    below_hidden_line,
    section_ends_at,
    section_title,
    start_allowed,
    label_start,
    missing_indentation,
    title_tokens,
)
from nest_integrations.corpus.chunking import chunk_passages, chunk_text, section_chunks, sentence_spans
from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.policy.copy_policy import acceptable_start, sentence_starts
from nest_integrations.store.datastore import TokenDatastore
from nest_integrations.store.encoder import PassageEncoder, tiling_char_spans

from conftest import ListRetriever, word_share

FENCE = "```"
SAMPLE = f"""---
title: Reply
sidebar: reference
---
<!-- Generated from docs/src/reply.md: edit that file instead. -->
<h1 align="center">Fastify</h1>

## Reply
<a id="reply"></a>

The second parameter of the handler function is `Reply`.
It exposes the following functions.

### Methods

#### .send(data)
<a id="senddata"></a>

Sends the payload to the user. See [the lifecycle][lifecycle].

{FENCE}js
fastify.get('/', (request, reply) => {{
  reply.send({{ hello: 'world' }})
}})
{FENCE}

| Option | Default |
| ------ | ------- |
| `code` | `200`   |

- `.code(statusCode)` - Sets the status code.
- `.header(key, value)` - Sets a response header.

[lifecycle]: ./Lifecycle.md
[hooks]: https://fastify.dev/docs/latest/Reference/Hooks/ "Hooks"
"""
SEND = ("Reply", "Methods", ".send(data)")
# Retrieval dominates: lambda ~ 0 at every step, and acceptance is lenient.
COPY = dict(alpha=5.0, tau=0.1, delta=1.0, gamma=1e-6)
UNIQUE = "Quixotic zebras juggle seventeen luminous marmalade jars beneath Harrogate."
KEEPER = "Their keeper, Ottoline Frump, counts every jar at dawn."


def _hidden_text(text: str) -> list[str]:
    layout = copy_layout(text)
    assert layout is not None
    return [text[start:end] for start, end in layout.hidden]


def test_blocks_have_their_kind_exact_range_and_heading_path():
    blocks = parse_blocks(SAMPLE)
    got = [(b.kind, SAMPLE[b.start : b.end], b.heading_path) for b in blocks]
    code = SAMPLE[SAMPLE.index(FENCE) : SAMPLE.rindex(FENCE) + 3]
    table = SAMPLE[SAMPLE.index("| Option") : SAMPLE.index("`200`   |") + 9]
    assert got == [
        ("front_matter", "---\ntitle: Reply\nsidebar: reference\n---", ()),
        ("comment", "<!-- Generated from docs/src/reply.md: edit that file instead. -->", ()),
        ("html", '<h1 align="center">Fastify</h1>', ()),
        ("heading", "## Reply", ("Reply",)),
        ("html", '<a id="reply"></a>', ("Reply",)),
        ("paragraph", "The second parameter of the handler function is `Reply`.\nIt exposes the following functions.", ("Reply",)),
        ("heading", "### Methods", ("Reply", "Methods")),
        ("heading", "#### .send(data)", SEND),
        ("html", '<a id="senddata"></a>', SEND),
        ("paragraph", "Sends the payload to the user. See [the lifecycle][lifecycle].", SEND),
        ("code", code, SEND),
        ("table", table, SEND),
        ("list_item", "- `.code(statusCode)` - Sets the status code.", SEND),
        ("list_item", "- `.header(key, value)` - Sets a response header.", SEND),
        ("link_definition", "[lifecycle]: ./Lifecycle.md", SEND),
        ("link_definition", '[hooks]: https://fastify.dev/docs/latest/Reference/Hooks/ "Hooks"', SEND),
    ]
    assert [b.level for b in blocks if b.kind == "heading"] == [2, 3, 4]
    assert code.startswith("```js\nfastify.get") and table.endswith("| `code` | `200`   |")


def test_setext_headings_indented_code_and_inline_html():
    text = "Title\n=====\n\nSee <b>this</b> now.\n\n    indented = 1\n    more = 2\n\n<!-- -->"
    blocks = parse_blocks(text)
    assert [(b.kind, text[b.start : b.end]) for b in blocks] == [
        ("heading", "Title\n====="),
        ("paragraph", "See <b>this</b> now."),
        ("code", "indented = 1\n    more = 2"),
        ("comment", "<!-- -->"),
    ]
    assert _hidden_text(text) == ["Title\n=====", "<b>", "</b>", "<!-- -->"]
    assert text[slice(*section_title(text, text.index("See")))] == "Title"
    anchored = '<a name="fail"></a>.fail(fn)\n----------\n\nRuns when parsing fails.\n\n<!-- -->'
    assert anchored[slice(*section_title(anchored, anchored.index("Runs")))] == ".fail(fn)", "an anchor is no part of the label"


@pytest.mark.parametrize(
    ("text", "metadata", "title", "expected"),
    [
        ("Plain words. More words.", {"source": "docs/guide.md"}, "", True),
        ("Plain words.", {"file_path": "/x/API.MDX"}, "", True),
        ("Plain words.", {"file_name": "notes.markdown"}, "", True),
        ("Plain words.", {"path": "notes.txt", "source": "wikipedia"}, "guide.md", True),
        ("## Install\n\nRun it.", {}, "", True),
        ("Plain words.", {"path": "notes.txt"}, "", False),
        # Docstrings are prose: a doctest comment and an RST underline are not Markdown.
        (">>> c = Counter('ab')\n\n# Knuth's example\n>>> import math\n", {}, "", False),
        ("Main API\n========\nrun(...): Runs a command.", {}, "", False),
    ],
)
def test_which_passages_are_markdown(text, metadata, title, expected):
    assert is_markdown(text, metadata, title) is expected


def test_hidden_markup_has_no_datastore_entries(tiny_lm):
    encoded = PassageEncoder(tiny_lm, encoding_prefix="chat").encode([SAMPLE])[0]
    layout = copy_layout(SAMPLE)
    assert layout is not None
    for (start, end), valid in zip(encoded.char_spans.tolist(), encoded.valid.tolist()):
        piece = SAMPLE[start:end]
        inside_hidden = any(a <= start and end <= b for a, b in layout.hidden)
        if piece.strip() and inside_hidden:
            assert not valid, f"hidden token {piece!r} has an entry"
    values = "".join(SAMPLE[s:e] for (s, e), v in zip(encoded.char_spans.tolist(), encoded.valid) if v)
    for markup in ("title: Reply", "<!--", "## Reply", "### Methods", '<a id="senddata">', "[lifecycle]: ./Lifecycle.md"):
        assert markup not in values
    for prose in ("The second parameter of the handler function", "Sends the payload to the user.", "reply.send("):
        assert prose in values


def test_prose_passages_keep_every_entry(tiny_lm, small_passages):
    encoder = PassageEncoder(tiny_lm, encoding_prefix="chat")
    prose = [p.text for p in small_passages] + ["Counter:\n\n# Knuth's example\n>>> import math\n\n    indented docstring line"]
    for text, encoded in zip(prose, encoder.encode(prose)):
        assert copy_layout(text) is None
        assert encoded.valid.all()
        assert copyable_tokens(text, encoded.char_spans).all()
        assert sentence_starts(text) == [s for s, _ in sentence_spans(text)]


def test_a_draft_stops_before_a_comment_and_a_heading(tiny_lm):
    prose = Passage(id="p", text=f"{UNIQUE}\n\n{KEEPER}")
    markdown = Passage(id="m", text=f"{UNIQUE}\n\n<!-- reviewed: yes -->\n## The keeper\n\n{KEEPER}", metadata={"source": "zebras.md"})
    outputs = {}
    for passage in (prose, markdown):
        decoder = NestDecoder(tiny_lm, TokenDatastore([passage], PassageEncoder(tiny_lm)), ListRetriever([passage]))
        outputs[passage.id] = decoder.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, stop_at_source_end=False, **COPY)
    # Prose runs on into the next paragraph; Markdown stops where the comment starts.
    assert "Harrogate.\n\nTheir keeper" in outputs["p"].copied_spans[0].text
    first = outputs["m"].copied_spans[0]
    assert first.text.endswith("beneath Harrogate.")
    for span in outputs["m"].copied_spans:
        assert "<!--" not in span.text and "##" not in span.text and "The keeper" not in span.text
        assert markdown.text[span.source.chunk_char_start : span.source.chunk_char_end] == span.text


def test_a_myst_target_is_hidden_and_never_copied(tiny_lm):
    """Sphinx documentation in Markdown (MyST) sets an anchor above a section as ``(label)=`` on a
    line alone, which renders as nothing: a copy running to the section's end stops before it, as
    before a link definition. A line opening with ``%`` stays text (a MyST comment elsewhere)."""
    text = f"{UNIQUE}\n\n(the-keeper)=\n\n## The keeper\n\n{KEEPER}\n% of them at dusk.\n"
    assert [b.kind for b in parse_blocks(text)] == ["paragraph", "link_definition", "heading", "paragraph"]
    markdown = Passage(id="m", text=text, metadata={"source": "z.md"})
    decoder = NestDecoder(tiny_lm, TokenDatastore([markdown], PassageEncoder(tiny_lm)), ListRetriever([markdown]))
    out = decoder.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, stop_at_source_end=False, **COPY)
    assert out.copied_spans[0].text.endswith("beneath Harrogate."), out.text
    assert all("(the-keeper" not in span.text for span in out.copied_spans), out.text


def test_a_colon_fenced_admonitions_fence_lines_are_hidden_and_its_body_is_copied(tiny_lm):
    """MyST (``:::{caution}``) and Docusaurus (``:::tip``) fence an admonition with colons: a reader
    sees the box and its text, never the fence lines. A copy runs through the body and past the
    fences; a chunk cut inside the box hides the closing line it holds too."""
    text = f"{UNIQUE}\n:::{{caution}}\n{KEEPER}\n:::\n\nAfter the box.\n"
    assert [b.kind for b in parse_blocks(text)] == ["paragraph", "directive", "paragraph", "directive", "paragraph"]
    assert [b.kind for b in parse_blocks(":::tip Use it\nText.\n:::\n")] == ["directive", "paragraph", "directive"]
    after_fence = text.index("{caution}") + len("{caution}")
    assert below_hidden_line(text, after_fence) == text.index(KEEPER), "under the hidden line, at the body's text"
    table = "Tools\n=====\n\n=========  =======\nName       Tool\n=========  =======\nAlpine     apk\n=========  =======\n"
    under_border = table.index("Tool\n") + len("Tool\n=========  =======")
    assert below_hidden_line(table, under_border) == under_border, "a table's next row keeps its line break"
    cut = f"{KEEPER}\n:::\n\nAfter the box.\n"
    layout = copy_layout(cut)
    assert layout is not None and [cut[start:end] for start, end in layout.hidden] == [":::"]
    markdown = Passage(id="m", text=text, metadata={"source": "z.md"})
    decoder = NestDecoder(tiny_lm, TokenDatastore([markdown], PassageEncoder(tiny_lm)), ListRetriever([markdown]))
    out = decoder.generate("Quixotic zebras", max_new_tokens=80, use_chat_template=False, stop_at_source_end=False, **COPY)
    assert f"beneath Harrogate.\n\n{KEEPER}" in out.text and ":::" not in out.text, "the body is a block of its own: " + out.text


def test_a_copy_that_reaches_the_next_heading_ends_the_answer(tiny_lm):
    """A section is where a copy ends: the next heading starts another topic."""
    markdown = Passage(id="m", text=f"{UNIQUE}\n\n<a id=\"keeper\"></a>\n## The keeper\n\n{KEEPER}", metadata={"source": "z.md"})
    decoder = NestDecoder(tiny_lm, TokenDatastore([markdown], PassageEncoder(tiny_lm)), ListRetriever([markdown]))
    out = decoder.generate("Quixotic zebras", max_new_tokens=40, use_chat_template=False, **COPY)
    assert out.text.endswith("beneath Harrogate.") and out.stats.finish_reason == "source_end"
    assert section_ends_at(markdown.text, len(UNIQUE)) and not section_ends_at(markdown.text, len(UNIQUE) - 3)
    assert not section_ends_at(f"{UNIQUE}\n\n{KEEPER}", len(UNIQUE)), "prose has no sections"


@pytest.mark.parametrize(
    ("text", "source", "marks"),
    [
        ("## Reset a header\n\nCall reply.removeHeader('set-cookie') to reset it.\n\n## Streams\n\nPipe a stream into the reply.", "Reply.md", "#"),
        ("Reset a header\n==============\n\nCall reply.removeHeader('set-cookie') to reset it.\n\n"
         "Streams\n=======\n\nPipe a stream into the reply.", "reply.rst", "==="),
    ],
)
def test_an_answer_planned_at_a_heading_opens_below_it(tiny_lm, text, source, marks):
    passage = Passage(id="reply", text=text, metadata={"source": source})
    decoder = NestDecoder(tiny_lm, TokenDatastore([passage], PassageEncoder(tiny_lm)), ListRetriever([passage]), relevance=word_share)
    out = decoder.generate("How do I reset the set-cookie header?", max_new_tokens=30, answer_windows=1, **COPY)
    # The heading's marks (a reStructuredText underline) are never copied: its title labels the window, then the window follows.
    assert out.spans[0].copied and marks not in out.text
    assert out.text.strip() == "Reset a header\n\nCall reply.removeHeader('set-cookie') to reset it."
    assert out.stats.finish_reason in ("answered", "source_end"), "it stops with its section"
    # A later window in the next section comes under that section's title, also without its marks.
    both = decoder.generate("How do I reset the set-cookie header?", max_new_tokens=30, answer_windows=2, **COPY)
    assert both.text.strip().startswith(out.text.strip() + "\n\n") and "Streams\n\nPipe a stream" in both.text, both.text
    assert marks not in both.text


def test_an_answer_that_opens_at_a_line_of_code_keeps_its_indentation(tiny_lm):
    """The code line's first token brings one space of its four (the others are the line break's
    token): the decoder sets the rest, so the line stays in its block."""
    text = (
        "Ask for a password twice, hidden, like this::\n\n"
        "    @click.command()\n    @click.password_option()\n    def encrypt(password):\n        click.echo(password)\n"
    )
    passage = Passage(id="pw", text=text, metadata={"source": "options.rst"})
    code = text.index("    @click.command()")
    first = text.index("@click") - 1  # the token " @click" opens the window
    assert missing_indentation(text, first) == "   "
    assert missing_indentation(text, code) == "" and missing_indentation(text, text.index("twice")) == ""
    assert missing_indentation("Plain prose,\n    indented.", len("Plain prose,\n   ")) == "", "prose: no code line"
    listed = f"# Proxy\n\n1. Trust a function:\n\n    {FENCE}js\n    trust(address)\n    {FENCE}\n"
    assert missing_indentation(listed, listed.index(FENCE) - 1) == "", "a fence indented past three spaces is none"
    assert missing_indentation(listed, listed.index("trust(") - 1) == "   "
    decoder = NestDecoder(tiny_lm, TokenDatastore([passage], PassageEncoder(tiny_lm)), ListRetriever([passage]), relevance=word_share)
    out = decoder.generate("What does click.password_option() do for encrypt(password)?", max_new_tokens=60, answer_windows=1, fill_windows=0, **COPY)
    assert out.text.startswith("    @click.command()\n    @click.password_option()"), out.text
    assert [s.copied for s in out.spans if s.text.strip()] == [True] * len([s for s in out.spans if s.text.strip()]), "the spaces alone are set"


def test_a_line_of_a_literal_block_cut_by_the_chunking_keeps_its_indentation():
    """A chunk cut inside a literal block opens with shell lines that read as text on their own;
    read after the chunk before, which announces the block with ``::``, they are code, and a copy
    that opens at one of them gets the indentation its first token does not bring."""
    lead = "Installing\n==========\n\nDrop the binary into your ``PATH`` and make it executable::\n\n    sudo cp borg-linux64 /usr/local/bin/borg\n"
    chunk = "    sudo chown root:root /usr/local/bin/borg\n    sudo chmod 755 /usr/local/bin/borg\n"
    at = chunk.index("sudo chmod") - 1  # the token " sudo" opens the copy
    assert missing_indentation(chunk, at) == "", "read alone: no code line"
    assert missing_indentation(chunk, at, lead) == "   "


def test_an_opening_skips_markup_blank_tokens_and_a_closing_fence(smol_tokenizer):
    text = f"## Charset\n\n{FENCE}js\nreply.type('application/json')\n{FENCE}\nIf no charset is set, utf-8 is used."
    enc = smol_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = tiling_char_spans(enc["offset_mapping"], len(text))
    opening = lambda char: first_copyable(text, spans, int(np.searchsorted(spans[:, 1], char, side="right")))  # noqa: E731
    assert text[spans[opening(0), 0] :].lstrip().startswith(f"{FENCE}js")
    assert text[spans[opening(text.rindex(FENCE)), 0] :].lstrip().startswith("If no charset")
    assert text[spans[opening(text.index("application")), 0] :].lstrip().startswith("If no charset"), "not mid-line in code"
    assert first_copyable("Plain prose.", spans[:3], 1) == 1


def test_a_copy_starts_inside_code_only_at_a_line_start():
    code_line = "result = compute(alpha, beta)"
    markdown = f"Call it like this.\n\n{FENCE}python\n{code_line}\nprint(result)\n{FENCE}\n"
    prose = f"Call it like this.\n\n{code_line}\nprint(result)\n"
    generated = "We write result = compute("
    for text, allowed in ((prose, True), (markdown, False)):
        mid_line = text.index("alpha")
        assert acceptable_start(generated, text, mid_line, sentence_starts(text)) is allowed
    starts = sentence_starts(markdown)
    for line in (f"{FENCE}python", code_line, "print(result)"):
        assert markdown.index(line) in starts
    assert markdown.rindex(FENCE) not in starts, "the closing fence starts no copy"
    assert acceptable_start("Here is how.", markdown, markdown.index(code_line), starts)
    assert not start_allowed(markdown, markdown.index("compute"))


def test_no_copy_starts_inside_hidden_markup():
    starts = sentence_starts(SAMPLE)
    layout = copy_layout(SAMPLE)
    assert layout is not None
    assert not [s for s in starts if any(a <= s < b for a, b in layout.hidden)]
    assert SAMPLE.index("The second parameter") in starts and SAMPLE.index("Sends the payload") in starts
    assert not acceptable_start("", SAMPLE, 0, starts), "front matter opens the text but is not copied"
    assert not acceptable_start("Done.", SAMPLE, SAMPLE.index("## Reply"), starts)


def test_sections_are_chunks_with_exact_offsets_and_heading_paths():
    doc = Passage(id="reply", text=SAMPLE, metadata={"source": "Reply.md"})
    chunks = chunk_passages([doc], max_words=30)
    assert len(chunks) > 1
    for chunk in chunks:
        assert doc.text[chunk.doc_char_start : chunk.doc_char_end] == chunk.text
        assert chunk.doc_id == "reply" and chunk.metadata["source"] == "Reply.md"
    by_start = {c.text.split("\n")[0]: c.metadata["heading_path"] for c in chunks}
    assert by_start["| Option | Default |"] == list(SEND)
    assert next(c for c in chunks if "#### .send(data)" in c.text).metadata["heading_path"] in (list(SEND), list(SEND[:2]))
    code = SAMPLE[SAMPLE.index(FENCE) : SAMPLE.rindex(FENCE) + 3]
    assert any(code in c.text for c in chunks), "a code block within the budget is never cut"
    assert not any(c.text.rstrip().endswith(("## Reply", "### Methods", "#### .send(data)")) for c in chunks)
    whole = chunk_passages([doc], max_words=1000)
    assert [c.text for c in whole] == [SAMPLE] and whole[0].metadata["heading_path"] == ["Reply"]
    assert chunks[-1].text.startswith("[lifecycle]:") and chunks[-1].metadata["heading_path"] == list(SEND)


def test_small_sibling_sections_share_a_chunk():
    text = "# Guide\n\n## A\n\nOne.\n\n## B\n\nTwo.\n\n## C\n\n" + " ".join(["word"] * 30) + ".\n"
    chunks = section_chunks(text, max_words=20)
    assert [text[c.start : c.end].split("\n")[0] for c in chunks] == ["# Guide", "## C", "word " * 11 + "word."]
    assert [c.heading_path for c in chunks] == [("Guide",), ("Guide", "C"), ("Guide", "C")]
    assert chunk_text(text, max_words=20) == [(c.start, c.end) for c in chunks]


def test_a_chunk_that_begins_inside_a_code_block_reads_its_code_as_code():
    chunk = f"  reply.send(data)\n}})\n{FENCE}\n\n### Streams\n\nPipe a stream.\n\n{FENCE}js\nreply.send(stream)\n{FENCE}\n"
    got = [(b.kind, chunk[b.start : b.end]) for b in parse_blocks(chunk)]
    assert got == [
        ("code", f"reply.send(data)\n}})\n{FENCE}"),
        ("heading", "### Streams"),
        ("paragraph", "Pipe a stream."),
        ("code", f"{FENCE}js\nreply.send(stream)\n{FENCE}"),
    ]
    assert chunk.index("})") in sentence_starts(chunk) and chunk.index(f"{FENCE}\n\n") not in sentence_starts(chunk)
    ending_inside = f"Pipe a stream.\n\n{FENCE}js\nreply.send(stream)\n"
    assert [b.kind for b in parse_blocks(ending_inside)] == ["paragraph", "code"]


def test_a_chunk_cut_inside_an_indented_code_block_keeps_its_first_lines_indentation():
    steps = "\n".join(f"    # step {i}\n    run_step({i})" for i in range(30))
    text = f"Setup\n=====\n\nRun the steps::\n\n{steps}\n\nThe steps are done.\n"
    chunks = chunk_text(text, max_words=20)
    inside = [text[start:end] for start, end in chunks if text.index(steps) < start < text.index("The steps")]
    assert len(inside) > 1
    # Every code line stays indented as in the document: none opens a chunk at its first
    # column, where a shell comment would read as a Markdown heading.
    assert all(chunk.startswith("    ") for chunk in inside)
    assert not any(line.startswith("#") for start, end in chunks for line in text[start:end].splitlines())
    prose = "One sentence here.   Another one follows it.  " * 5
    assert all(not prose[start].isspace() for start, _ in chunk_text(prose, max_words=6))


def test_llama_index_node_parser_offsets_are_exact():
    pytest.importorskip("llama_index.core")
    from llama_index.core import Document

    from nest_integrations.llama_index import MarkdownSectionNodeParser

    # Two identical sections: searching for a node's text would find the first one twice.
    section = "## Twice\n\nThe same words under the same heading, long enough to fill a node.\n\n"
    text = "# Doc\n\nIntro.\n\n" + section + section
    nodes = MarkdownSectionNodeParser(chunk_size=90).get_nodes_from_documents([Document(text=text, metadata={"file_name": "d.md"})])
    assert [(n.start_char_idx, n.end_char_idx) for n in nodes][-2:] == [
        (text.index(section), text.index(section) + len(section.strip())),
        (text.rindex(section), text.rindex(section) + len(section.strip())),
    ]
    for node in nodes:
        assert text[node.start_char_idx : node.end_char_idx] == node.text
        assert node.metadata["file_name"] == "d.md" and node.metadata["heading_path"][0] == "Doc"


def test_a_window_knows_the_title_of_its_section_and_copies_it_without_the_marks(smol_tokenizer):
    text = "Intro.\n\n#### `customLevels` (Object)\n\nDefault: none\n\nUse this option to add levels.\n"
    title = section_title(text, text.index("Use this"))
    assert title is not None and text[slice(*title)] == "`customLevels` (Object)"
    assert section_title(text, 2) is None and section_title("Plain prose. More prose.", 5) is None
    ids = smol_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = tiling_char_spans(ids["offset_mapping"], len(text))
    first = int(np.searchsorted(spans[:, 1], len("Intro."), side="right"))  # the line breaks before the heading
    last = int(np.searchsorted(spans[:, 0], title[1], side="left")) - 1
    title_first = int(np.searchsorted(spans[:, 1], title[0], side="right"))
    assert label_start(text, spans, title_first) == first, "back over the marks and the line breaks, not into 'Intro.'"
    copied = "".join(text[slice(*spans[i])] for i in title_tokens(text, spans, first, last))
    assert "#" not in copied and copied.strip() == "`customLevels` (Object)" and copied.startswith("\n")


NOTES = """## Names

It was really just a way to say `attrs` and `attrib`[^attr].
A character class such as `[^a-z]` is code, no footnote.

[^attr]: We considered calling the package `attr` too.
    The name was already taken.

    Looking at who took it was a good guideline.

[^pypi]: https://pypi.org/project/attr/
"""


def _blocks_of(text: str) -> list[tuple[str, str]]:
    return [(b.kind, text[b.start : b.end]) for b in parse_blocks(text)]


def _word_spans(text: str) -> np.ndarray:
    """Spans tiling ``text``: each run of non-blank characters with the white space before it."""
    ends = [m.end() for m in re.finditer(r"\s*\S+", text)]
    starts = [0, *ends[:-1]]
    return np.array(list(zip(starts, ends)), dtype=np.int64).reshape(-1, 2)


def test_a_footnote_shows_its_note_but_not_its_markers():
    """A rendered page shows a footnote's note under a number: its `[^label]:` marker and the
    `[^label]` references are markup; the note, its indented continuation included, is text."""
    assert _blocks_of(NOTES) == [
        ("heading", "## Names"),
        ("paragraph", "It was really just a way to say `attrs` and `attrib`[^attr].\nA character class such as `[^a-z]` is code, no footnote."),
        ("paragraph", "[^attr]: We considered calling the package `attr` too.\n    The name was already taken."),
        ("paragraph", "Looking at who took it was a good guideline."),
        ("paragraph", "[^pypi]: https://pypi.org/project/attr/"),
    ]
    assert _hidden_text(NOTES) == ["## Names", "[^attr]", "[^attr]:", "[^pypi]:"]
    spans = _word_spans(NOTES)
    copied = "".join(NOTES[s:e] for (s, e), ok in zip(spans.tolist(), copyable_tokens(NOTES, spans)) if ok)
    for note in ("We considered calling the package `attr` too.", "Looking at who took it", "https://pypi.org/project/attr/", "`[^a-z]` is code"):
        assert note in copied
    assert "[^attr]" not in copied and "[^pypi]" not in copied
    assert not start_allowed(NOTES, NOTES.index("[^attr]:")) and start_allowed(NOTES, NOTES.index("We considered"))
    assert NOTES[slice(*section_title(NOTES, NOTES.index("Looking")))] == "Names", "the heading is still a heading"


def test_a_footnote_reference_alone_makes_a_chunk_markdown():
    """A chunk of a Markdown page may show no other Markdown syntax; its footnote reference is
    still markup. A regular expression's character class is not one."""
    chunk = "That is a hacky requirement for a very common problem.[^immutable]\n\n- To attach methods you have to subclass it.\n"
    assert looks_like_markdown(chunk) and _hidden_text(chunk) == ["[^immutable]"]
    assert not looks_like_markdown("Strip it with re.sub(r'[^a-z]+', '', s) and go on.")
    # MyST writes a named reference after a space too; read as reStructuredText (its roles), the
    # chunk would hide nothing and the reference would be copied.
    spaced = "  - This can be disabled by passing `weakref_slot=False` to {func}`attrs.define` [^pypyweakref].\n"
    assert looks_like_markdown(spaced) and _hidden_text(spaced) == ["[^pypyweakref]"]
    assert not looks_like_markdown("Match any other letter with [^a-z] in the pattern.")


def test_a_text_that_opens_with_a_bare_fence_opens_a_code_block_with_it():
    """An answer that copied a diagram's bare opening fence and was cut before its closing one is
    inside that block: the fence that closes it is the one to set, with prose copied before the
    diagram too. A chunk cut inside a block, which closes it with a bare fence before its prose,
    still reads its opening lines as code; an answer is read whole, as a Markdown reader reads it."""
    from nest_integrations.corpus.markdown_structure import unclosed_fence

    diagram = "```\nfastify.close() called\n  │\n  ├─▶ closing = true (new requests receive 503)\n  │"
    assert [(b.kind, b.start, b.end) for b in parse_blocks(diagram)] == [("code", 0, len(diagram))]
    assert unclosed_fence(diagram) == "```"
    assert unclosed_fence("Requests in flight are still being processed.\n\n" + diagram) == "```"
    assert ends_in_code("Requests in flight are still being processed.\n\n" + diagram)
    cut = "  return reply.send(x)\n})\n```\n\nThen start the server."
    assert [b.kind for b in parse_blocks(cut)] == ["code", "paragraph"]
    assert unclosed_fence(cut) == "```"  # the stray fence opens a block for a reader of the whole text


def test_a_text_ends_in_code_on_a_code_line_or_its_closing_fence():
    fence = "```"
    assert ends_in_code(f"Capture it:\n\n{fence}js\nparse(args, cb)\n{fence}")
    assert ends_in_code(f"Capture it:\n\n{fence}js\nparse(args, cb)\n")
    assert ends_in_code("Run it::\n\n    borg create repo::archive ~\n")
    assert not ends_in_code(f"Capture it:\n\n{fence}js\nparse(args, cb)\n{fence}\n\nThen read the output.")
    assert not ends_in_code("Plain prose that ends here.") and not ends_in_code("")


def test_a_copy_opening_inside_a_fenced_block_is_given_its_fence():
    """A copy that opens at a line of code whose fence lies above it (in its chunk, or in the chunk
    before when a chunker cut the block) needs that fence; one at the opener, in prose, in an
    indented block or past the closing fence does not."""
    from nest_integrations.corpus.markdown_structure import opening_fence

    lead = "Use it:\n\n~~~~js\nvar streams = [\n"
    chunk = "  {level: 'fatal'}\n]\nvar log = pino()\n~~~~\n\nThen read it."
    assert opening_fence(chunk, 0, lead) == "~~~~" and opening_fence(chunk, chunk.index("var log"), lead) == "~~~~"
    assert opening_fence(chunk, 0) is None  # read alone, the chunk's lines are prose
    assert opening_fence(chunk, chunk.index("Then"), lead) is None
    whole = "Run:\n\n```sh\nquill build\nquill serve\n```\n"
    assert opening_fence(whole, whole.index("quill serve")) == "```"
    assert opening_fence(whole, whole.index("```sh")) is None and opening_fence(whole, whole.index("Run")) is None
    assert opening_fence("Run:\n\n    quill build\n    quill serve\n", 22) is None


def test_a_copy_opening_in_code_indented_too_little_to_read_as_code_is_given_a_fence():
    """A reStructuredText code directive's body indented three spaces, or a doctest at the
    margin, reads as prose in a Markdown answer: a copy opening in it (at a line's indentation,
    or at the line break before it) needs a bare fence, and ends where the block does. A body
    indented four spaces reads as code without one."""
    from nest_integrations.corpus.markdown_structure import code_block_at, opening_fence, shallow_code_block

    rst = "Run it:\n\n.. code-block:: python\n\n   runner = CliRunner()\n   runner.invoke(cli)\n\nThe result holds the exit code."
    body = rst.index("   runner")
    end = rst.index("(cli)") + len("(cli)")
    assert opening_fence(rst, body) == "```" and opening_fence(rst, body - 2) == "```"  # the line break before it
    assert opening_fence(rst, rst.index("runner.invoke")) == "```"
    assert shallow_code_block(rst, body) == (body + 3, end) == code_block_at(rst, body)
    assert opening_fence(rst, rst.index("The result")) is None and code_block_at(rst, end) is None
    doctest = "Usage\n=====\n\nUse it:\n\n>>> add(1, 2)\n3\n\nThat is all."
    assert opening_fence(doctest, doctest.index(">>>")) == "```"
    deep = rst.replace("\n   ", "\n    ")
    assert opening_fence(deep, deep.index("    runner")) is None and shallow_code_block(deep, deep.index("    runner")) is None
    assert code_block_at(deep, deep.index("    runner")) is not None
    lead, chunk = rst[:body], rst[body:]  # a chunker cut at the body: its lines are code only after the chunk before
    assert opening_fence(chunk, 0, lead) == "```" and shallow_code_block(chunk, 0, lead) == (3, end - body)


def test_code_indented_four_spaces_needs_a_fence_only_where_the_answer_would_read_it_as_prose():
    """A block indented four spaces reads as code after a paragraph break, but as a list item's
    paragraph right under the item's text, and as a paragraph's own line right under its last
    line. The fence a copy of it needs is read from the answer so far: after any block the answer
    leaves open (the fence the decoder has just set above it), and with the line breaks the copy
    brings."""
    from nest_integrations.corpus.markdown_structure import opening_fence, reads_as_code_after, unfenced_code_block

    line = "    rm -rf chunks.archive.d"
    assert reads_as_code_after("", line) and reads_as_code_after("It keeps a cache.", line)
    assert reads_as_code_after("It keeps a cache.\n\n", line)
    assert not reads_as_code_after("Some pros and cons:\n\n- much less disk space needed.", line)
    assert not reads_as_code_after("It keeps a cache.\n", line)  # a paragraph's line
    assert reads_as_code_after("It keeps a cache.\n", "\n" + line)  # the copy brings its blank line
    assert reads_as_code_after("- much less disk space needed.", "      rm -rf chunks.archive.d")  # past the item's text
    assert not reads_as_code_after("- much less disk space needed.\n\n```\n", line)  # read before the open fence
    assert not reads_as_code_after("", "   rm -rf chunks.archive.d")  # three spaces read as prose anywhere

    rst = "Cache\n=====\n\nDrop the indexes::\n\n    rm -rf chunks.archive.d\n    touch chunks.archive.d\n\nThat is all."
    body = rst.index("    rm")
    assert opening_fence(rst, body) is None and opening_fence(rst, body, after="It keeps a cache.") is None
    assert opening_fence(rst, body, after="Some pros and cons:\n\n- much less disk space needed.") == "```"
    assert unfenced_code_block(rst, body) == (body + 4, rst.index("\n\nThat"))
    fenced = "Drop them:\n\n```sh\nrm -rf chunks.archive.d\n```\n"
    assert unfenced_code_block(fenced, fenced.index("rm")) is None and unfenced_code_block(rst, rst.index("That")) is None


def test_a_copy_of_prose_that_runs_into_code_indented_too_little_ends_above_it():
    """Where a copy of a ``::`` paragraph would run on into its literal block (indented three
    spaces): the end of the paragraph, so the decoder can set the fence above the code. Not for a
    copy that ends before the block, nor for a block indented four spaces."""
    from nest_integrations.corpus.markdown_structure import shallow_code_entry

    rst = "Layout\n======\n\nLay it out as follows::\n\n   foo\n   └── src\n\nThen build it."
    paragraph_end = rst.index("::") + 2
    assert shallow_code_entry(rst, rst.index("Lay"), len(rst)) == paragraph_end
    assert shallow_code_entry(rst, rst.index("Lay"), paragraph_end) is None
    assert shallow_code_entry(rst, rst.index("Then"), len(rst)) is None
    deep = rst.replace("\n   ", "\n    ")
    assert shallow_code_entry(deep, deep.index("Lay"), len(deep)) is None


def test_a_comment_indented_in_a_restructuredtext_code_block_is_no_markdown_title():
    """A shell or Python comment indented three spaces in a code directive's body, with a blank
    line after it, reads in a Markdown reader as a title; it made a whole Sphinx page Markdown (its
    titles, directives and literal blocks then read wrong) and named a "see also" section after the
    comment. A ``# Title`` at the margin with a blank line after it is one."""
    rst = "Manifest\n========\n\n.. code-block:: bash\n\n   graft src\n   # `-> adds all files inside a directory\n\nThen build it."
    assert not looks_like_markdown(rst)
    assert parse_blocks(rst)[0].kind == "heading" and parse_blocks(rst)[-1].heading_path == ("Manifest",)
    assert looks_like_markdown("# Manifest\n\nGraft the source folder.")
