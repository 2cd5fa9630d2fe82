"""The block structure of Markdown (and reStructuredText) passages, and which of their characters may be copied.

Markdown documentation carries markup a reader never sees rendered: YAML front
matter, ``<!-- ... -->`` comments, HTML blocks and anchors, link-reference
definitions (``[foo]: https://...``), footnote markers (``[^1]`` and the
``[^1]:`` opening a note, whose text a reader does see), thematic breaks,
the fence lines of colon-fenced containers (MyST's ``:::{note}``, Docusaurus'
``:::tip``; their body is Markdown a reader sees) and the ``## Title`` line of a heading. Copied as if it were prose, it ends up in answers. This
module reads a passage's structure with the CommonMark parser ``markdown-it-py``
(front matter, MyST targets and colon-fenced containers by ``mdit-py-plugins``, tables
enabled) and answers three
questions, always in character offsets into the ORIGINAL text (nothing is
rewritten, so citations keep pointing into the source):

* :func:`parse_blocks`: the typed blocks of a text with their heading path
  (what chunking cuts along);
* :func:`copyable_tokens`: which tokens may be copied (the datastore marks the
  others' entries invalid; a draft stops before the first of them:
  :func:`copyable_end`);
* :func:`start_allowed`: where a copy may start (inside code only at the start
  of a line; never inside hidden markup), used by the seam rule of
  :mod:`nest_integrations.policy.copy_policy`.

**Which passages are Markdown.** The datastore and the decoder see a passage's
text only (lazily encoded, precomputed and Ray-built keys must agree, and a
chunk cut by a user's splitter carries whatever metadata its loader gave), so
there the rule is a content sniff, :func:`looks_like_markdown`: a text is read
as Markdown when a line shows block syntax that prose does not have: a
``##``-``######`` heading, a ``# Title`` at the margin followed by a blank line (a lone
``# comment`` line in a doctest is not one, nor one indented in a reStructuredText code block), a code fence, front matter, an
HTML comment or a tag opening a line, a link-reference definition, a table
delimiter row, a colon fence (``:::{note}``, ``:::tip``, ``:::``). Setext (``===``-underlined) headings are not sniffed as
Markdown: reStructuredText and docstrings underline titles the same way. A
text that is not Markdown but shows reStructuredText's block syntax (an
underlined title, a directive, a target, a literal block) is read by
:mod:`nest_integrations.corpus.rst_structure` into the same blocks, and every
function below serves it alike (:func:`has_structure`). Everything else is
prose and every token of it may be copied (the bundled Wikipedia summaries read
as prose). Chunking (:mod:`nest_integrations.corpus.chunking`) also knows the file: a passage whose
``source`` / ``file_path`` / ``file_name`` / ``path`` metadata or title ends in
``.md``, ``.markdown`` or ``.mdx`` is cut along its sections
(:func:`is_markdown`); reStructuredText is cut by sentences like prose (cut along its
sections, it lost answers on held-out documentation). A chunk with no block syntax at all has no markup to
hide, so the two rules only differ on what prose structure they see.

**Chunks cut inside code.** A chunk is parsed on its own text. One cut out of
a document inside a code block (character splitters such as LangChain's
``RecursiveCharacterTextSplitter`` and LlamaIndex's ``SentenceSplitter`` often
cut there) closes that block with a bare fence, which alone reads as opening one, so code and prose would swap up
to the next fence; :func:`_block_tokens` also reads such a text as if a fence
opened before it, and keeps whichever reading misreads fewer fences. An
answer is no chunk: what the decoder asks of the answer so far (:func:`unclosed_fence`,
:func:`ends_in_code`) reads it whole, as a Markdown reader does. What is
left: a chunk of code with no fence at all reads as prose, and a fence
indented in a list item whose indentation the splitter stripped stays open.
The section chunkers here (:func:`nest_integrations.corpus.chunking.chunk_passages`
and the integrations' Markdown splitters) cut inside a code block only when
it alone exceeds the budget.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from .blocks import ADORNMENT_CHARACTER, Block, BlockKind, line_starts, trimmed_range
from .rst_structure import looks_like_rst, parse_rst

if TYPE_CHECKING:  # pragma: no cover
    from markdown_it import MarkdownIt

MARKDOWN_SUFFIXES: tuple[str, ...] = (".md", ".markdown", ".mdx")
"""File name endings that make a passage Markdown (:func:`is_markdown`)."""

NAME_FIELDS: tuple[str, ...] = ("source", "file_path", "file_name", "path")
"""Metadata fields holding a passage's file name (LangChain loaders: ``source``; LlamaIndex readers: ``file_path``, ``file_name``)."""

INDENTED_CODE_COLUMNS = 4
"""The indentation (columns, a tab 4) every line of a code block needs to read as code in a
Markdown answer without a fence (CommonMark's indented code block). A reStructuredText code
directive's body indented three spaces, or a doctest at the margin, copied as it is reads as
prose: the decoder fences it (:func:`opening_fence`, :func:`shallow_code_block`), as it fences a block
indented deeply enough that an answer would read as a list item's paragraph
(:func:`reads_as_code_after`)."""

_SNIFF = re.compile(
    r"\A---[ \t]*\n"  # YAML front matter opening the text
    r"|^ {0,3}#{2,6}[ \t]+\S"  # an ATX heading below the title...
    r"|^#[ \t]+\S[^\n]*\n[ \t]*(?:\n|\Z)"  # ...or a title at the margin with a blank line after (not a "# comment")
    r"|^(?:[ \t]{0,3}>[ \t]?)*[ \t]{0,3}(?:```|~~~)"  # a code fence, maybe in a block quote
    r"|<!--"  # an HTML comment
    r"|^ {0,3}</?[A-Za-z][A-Za-z0-9-]*(?:[ \t/]|>(?!`)|$)"  # an HTML tag opening a line (not reST's wrapped "<target>`")
    r"|^ {0,3}\[[^\]\n]+\]:[ \t]*\S"  # a link-reference definition
    r"|^ {0,3}:{3,}[ \t]*(?:\{[\w.:+-]+\}|[A-Za-z])|^ {0,3}:::[ \t]*$"  # a colon fence (three colons closing: no title's underline)
    r"|^ {0,3}\|?[ \t]*:?-{3,}:?[ \t]*\|"  # a table's delimiter row
    r"|\S\[\^[\w-]+\](?=[\s.,;:!?)]|\Z)"  # a footnote reference after a word ("problem.[^1]"), not a regex's [^a-z]+
    r"|[ \t]\[\^[A-Za-z][A-Za-z0-9_][\w-]*\](?=[\s.,;:!?)]|\Z)",  # ...or a named one after a space ("`@attr.s` [^pypy]"), not [^a-z]
    re.MULTILINE,
)
_FENCE_LINE = re.compile(r"[ \t]*(~{3,}|`{3,})[ \t]*")
_INFO_FENCE = re.compile(r"[ \t]*(?:>[ \t]*)*(?:```|~~~)[`~]*[ \t]*[^`~\s]")
_BARE_FENCE = re.compile(r"^[ \t]*(?:>[ \t]*)*(?:```|~~~)[`~]*[ \t]*$", re.MULTILINE)
_LINK_DEFINITION = re.compile(r"[ \t]*(?:>[ \t]*)*\[[^\]\n]+\]:")
_FOOTNOTE_DEFINITION = re.compile(r"\[\^[^\]\s]+\]:")
"""The marker opening a footnote's definition (``[^1]: The note.``): markup, rendered as the
note's number; the note after it is text a reader sees, at the page's end."""
_FOOTNOTE_REFERENCE = re.compile(r"\[\^[^\]\s]+\]")
"""A footnote reference in text (``attrib[^attr]``): markup, rendered as a superscript number."""
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(?:(?!\n[ \t]*\n)[\s\S])*?(?<!`)\1(?!`)")
"""An inline code span (within a paragraph): ``[^a-z]`` there is a regex, no footnote reference."""
_LEAF_KINDS: dict[str, BlockKind] = {
    "heading_open": "heading", "fence": "code", "code_block": "code", "hr": "rule", "table_open": "table",
    "front_matter": "front_matter", "myst_target": "link_definition",
}
"""The block kind of each markdown-it token that opens a leaf block (paragraphs and HTML blocks aside).
A MyST target (``(label)=`` on a line alone, Sphinx documentation's anchor above a section) is
rendered as nothing, as a reStructuredText target ``.. _label:`` is."""
_LEAF_OPENERS = {*_LEAF_KINDS, "paragraph_open", "html_block"}
_CONTAINER_NAME = re.compile(r"[ \t]*(?:\{[\w.:+-]+\}|[A-Za-z][\w-]*)(?:[ \t]|$)")
_CONTAINER_FENCE = re.compile(r"[ \t]*:{3,}[ \t]*")
"""A line that closes a colon-fenced container; alone in a chunk, it closes one opened above the chunk."""


def named_markdown(name: object) -> bool:
    """Whether a file name or path ends in a Markdown suffix (:data:`MARKDOWN_SUFFIXES`, any case),
    maybe then ``.gz`` (compressed, as Debian ships documentation: ``README.md.gz``)."""
    return isinstance(name, str) and name.casefold().rstrip().removesuffix(".gz").endswith(MARKDOWN_SUFFIXES)


def looks_like_markdown(text: str) -> bool:
    """Whether ``text`` shows Markdown block syntax that prose does not have (see the module
    docstring); a fence-like line right under a line of text can be a reStructuredText title's
    underline instead (:func:`_fence_like_underline`)."""
    return any(not _fence_like_underline(text, match.start()) for match in _SNIFF.finditer(text))


def _fence_like_underline(text: str, pos: int) -> bool:
    """Whether the line at ``pos`` underlines the line of text above it: nothing but ``~``, or
    four or more backticks and at least as long as that line. A Markdown fence can follow a
    line of text too ("Example:" or a code line, then three backticks), but is three backticks
    long; reStructuredText underlines a title with any punctuation, as long as the title or
    longer."""
    line_start = text.rfind("\n", 0, pos) + 1
    line = text[line_start:].partition("\n")[0]
    above = text[: max(line_start - 1, 0)].rpartition("\n")[2].strip()
    fence = _FENCE_LINE.fullmatch(line)
    if line_start == 0 or fence is None or not above:
        return False
    return fence.group(1)[0] == "~" or len(fence.group(1)) >= max(4, len(above))


def is_markdown(text: str, metadata: Mapping[str, Any] | None = None, title: str = "") -> bool:
    """Whether a passage is Markdown: a file name in ``metadata`` (:data:`NAME_FIELDS`) or
    ``title`` ends in a Markdown suffix, or its text looks like Markdown (:func:`looks_like_markdown`)."""
    names = [title, *((metadata or {}).get(key) for key in NAME_FIELDS)]
    return any(named_markdown(name) for name in names) or looks_like_markdown(text)


@functools.lru_cache(maxsize=1)
def _parser() -> "MarkdownIt":
    """CommonMark with tables, front matter, MyST targets and colon-fenced containers
    (:func:`_names_a_container`); built once (parsing keeps no state in it).

    Of the MyST block syntax only targets are read: its comments (a line opening with ``%``) and
    block breaks (``+++``) are text in any other Markdown, where a wrapped line may open with
    "% of" and would be hidden."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.container import container_plugin
    from mdit_py_plugins.front_matter import front_matter_plugin
    from mdit_py_plugins.myst_blocks import myst_block_plugin

    parser = MarkdownIt("commonmark").enable("table").use(front_matter_plugin).use(myst_block_plugin)
    parser.use(container_plugin, name="directive", marker=":", validate=_names_a_container)
    return parser.disable(["myst_line_comment", "myst_block_break"])


def _names_a_container(params: str, *_: Any) -> bool:
    """Whether the rest of a line of three colons or more names what it opens: MyST's colon fence
    (``:::{note}``, a Sphinx directive) or markdown-it-container's (``:::tip Title``, VuePress and
    Docusaurus admonitions), whose fence lines a reader never sees and whose body is Markdown."""
    return _CONTAINER_NAME.match(params) is not None


def _inline_title(inline: Any) -> str:
    """A heading's title as a reader sees it: its text and code spans, without markup."""
    parts = [child.content for child in inline.children or () if child.type in ("text", "code_inline", "softbreak")]
    return "".join(parts).strip() or inline.content.strip()


def _leaf_kind(token: Any, in_list_item: bool) -> BlockKind:
    """The kind of the block a leaf token (:data:`_LEAF_KINDS`) opens."""
    if token.type == "html_block":
        return "comment" if token.content.lstrip().startswith("<!--") else "html"
    if token.type == "paragraph_open":
        return "list_item" if in_list_item else "paragraph"
    return _LEAF_KINDS[token.type]


def _fence_lines(text: str, lines: list[int], first: int, stop: int) -> list[int]:
    """The lines of a colon-fenced container that spans lines ``[first, stop)`` of ``text`` (its
    token's map) that a reader does not see: the opening one, and the closing one, line ``stop``,
    unless the text ended first."""
    closing = stop < len(lines) - 1 and _CONTAINER_FENCE.fullmatch(text[lines[stop] : lines[stop + 1]].rstrip("\n"))
    return [first, stop] if closing else [first]


def _closing_fence(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The range of the last line of the paragraph ``text[start:end]`` when it closes a colon-fenced
    container (:data:`_CONTAINER_FENCE`), or None. A chunk cut inside a container lacks its opening
    line, so CommonMark reads the closing one as the paragraph's last line, or as a paragraph."""
    line_start = text.rfind("\n", start, end) + 1 or start
    return (line_start, end) if _CONTAINER_FENCE.fullmatch(text[line_start:end]) else None


def _link_definitions(text: str, lines: list[int], covered: list[bool]) -> list[tuple[int, int]]:
    """Line ranges ``[first, stop)`` of the link-reference definitions: markdown-it consumes them
    without a token, so they are the non-blank lines no block covers that open with ``[label]:``
    (a definition's title may continue on the next uncovered line)."""
    found: list[tuple[int, int]] = []
    for i in range(len(lines) - 1):
        line = text[lines[i] : lines[i + 1]]
        if covered[i] or not line.strip():
            continue
        if _LINK_DEFINITION.match(line):
            found.append((i, i + 1))
        elif found and found[-1][1] == i:
            found[-1] = (found[-1][0], i + 1)
    return found


def _fence_misreadings(source: str, tokens: list[Any]) -> tuple[int, int]:
    """How implausibly a parse reads the code fences of ``source``: ``(fence lines with an info
    string read as code content, code blocks whose fence is never closed or that hold no line)``.
    Documentation opens a fence with its language (```js) and closes it bare, and writes no empty
    block: a text that opens with a bare fence (a diagram's) opens a block with it."""
    lines = source.split("\n")
    inside = unclosed = 0
    for token in tokens:
        if token.type != "fence" or token.map is None:
            continue
        body = lines[token.map[0] + 1 : token.map[1]]
        inside += sum(bool(_INFO_FENCE.match(line)) for line in body)
        unclosed += len(body) < 2 or not _BARE_FENCE.match(body[-1])
    return inside, unclosed


def _block_tokens(text: str, chunk: bool) -> list[Any]:
    """markdown-it's tokens for ``text``, line maps into ``text``.

    A chunk cut out of a document inside a code block begins with code and
    closes the block with a bare fence, which a parser of the chunk alone reads
    as opening one: code and prose swap up to the next fence. So a ``chunk`` with
    fences is also parsed as if a fence opened before it, and that reading is
    kept when it misreads fewer fences (:func:`_fence_misreadings`). A text that
    is no chunk (an answer, read whole from its start) is read as CommonMark reads it.
    """
    tokens = _parser().parse(text)
    if not chunk or not _BARE_FENCE.search(text):
        return tokens
    opened = "```\n" + text
    shifted = _parser().parse(opened)
    if _fence_misreadings(opened, shifted) >= _fence_misreadings(text, tokens):
        return tokens
    for token in shifted:
        if token.map is not None:
            token.map = [max(token.map[0] - 1, 0), token.map[1] - 1]
    return shifted


def has_structure(text: str) -> bool:
    """Whether ``text`` has blocks to read: it looks like Markdown (:func:`looks_like_markdown`)
    or like reStructuredText (:func:`~nest_integrations.corpus.rst_structure.looks_like_rst`)."""
    return looks_like_markdown(text) or looks_like_rst(text)


@functools.lru_cache(maxsize=512)
def _parsed(text: str, chunk: bool = True) -> tuple[tuple[Block, ...], tuple[tuple[int, int], ...]]:
    """``(blocks, inline marks)`` of ``text``, read as reStructuredText when it looks like
    it and not like Markdown, else as Markdown (as a ``chunk``: :func:`_block_tokens`); the
    marks are the sorted character ranges of the markup inside copyable blocks (inline HTML,
    footnote markers, a simple table's borders). Cached because the encoder, the seam rule and
    the draft builder all read the same passages."""
    if not looks_like_markdown(text) and looks_like_rst(text):
        return parse_rst(text)
    return _parsed_markdown(text, chunk)


def _parsed_markdown(text: str, chunk: bool) -> tuple[tuple[Block, ...], tuple[tuple[int, int], ...]]:
    """``(blocks, inline marks)`` of ``text`` read as Markdown: inline HTML and footnote markup
    (:func:`_footnotes`)."""
    tokens = _block_tokens(text, chunk)
    lines = line_starts(text)
    covered = [False] * (len(lines) - 1)
    blocks: list[Block] = []
    inline_html: list[tuple[int, int]] = []
    fence_marks: list[tuple[int, int]] = []  # the closing lines of containers opened above a chunk
    headings: list[tuple[int, str]] = []  # (level, title) of the enclosing headings
    containers: list[str] = []
    for i, token in enumerate(tokens):
        if token.type in ("list_item_open", "blockquote_open"):
            containers.append(token.type)
        elif token.type in ("list_item_close", "blockquote_close"):
            containers.pop()
        if token.type == "container_directive_open" and token.map is not None:
            for line in _fence_lines(text, lines, *token.map):
                covered[line] = True
                blocks.append(Block("directive", *trimmed_range(text, lines, line, line + 1), tuple(t for _, t in headings)))  # type: ignore[misc]
            continue
        if token.type not in _LEAF_OPENERS or token.map is None:
            continue
        first, stop = token.map
        covered[first:stop] = [True] * (stop - first)
        span = trimmed_range(text, lines, first, stop)
        if span is None:
            continue
        kind = _leaf_kind(token, bool(containers) and containers[-1] == "list_item_open")
        closing = _closing_fence(text, *span) if kind == "paragraph" else None
        if closing == span:
            kind = "directive"
        elif closing is not None:
            fence_marks.append(closing)
        level = 0
        if kind == "heading":
            level = int(token.tag[1])
            headings = [h for h in headings if h[0] < level] + [(level, _inline_title(tokens[i + 1]))]
        tags = _inline_html(text, tokens, i, span) if kind in ("paragraph", "list_item", "table") else []
        if tags and _only_markup(text, span, tags):
            kind, tags = "html", []  # an anchor line such as <a id="x"></a>
        inline_html.extend(tags)
        blocks.append(Block(kind, span[0], span[1], tuple(title for _, title in headings), level))
    for first, stop in _link_definitions(text, lines, covered):
        span = trimmed_range(text, lines, first, stop)
        assert span is not None
        path = next((b.heading_path for b in reversed(blocks) if b.start < span[0]), ())
        blocks.append(Block("link_definition", span[0], span[1], path))
    blocks.sort(key=lambda b: b.start)
    blocks, footnote_marks = _footnotes(text, blocks)
    return tuple(blocks), tuple(sorted(inline_html + fence_marks + footnote_marks))


def _footnotes(text: str, blocks: list[Block]) -> tuple[list[Block], list[tuple[int, int]]]:
    """``(blocks, marks)``: ``blocks`` (in order) with each footnote definition a paragraph, and
    the character ranges of the footnote markup in copyable blocks: each definition's
    ``[^label]:`` marker and each ``[^label]`` reference outside a code span.

    CommonMark has no footnotes: markdown-it reads a definition as a paragraph (as a
    link-reference definition when the note is one word or a URL), and the note's indented
    continuation after a blank line as code. A reader of a rendered page sees the note's text
    under a number, so it is a paragraph and only its marker is hidden. A reference is hidden
    even when its definition is not in ``text``: a chunk rarely holds both.
    """
    out: list[Block] = []
    marks: list[tuple[int, int]] = []
    for block in blocks:
        marker = None
        if block.kind in ("paragraph", "link_definition"):
            marker = _FOOTNOTE_DEFINITION.match(text, block.start, block.end)
        indented_code = block.kind == "code" and not text.startswith(("```", "~~~"), block.start)
        if marker:
            block = replace(block, kind="paragraph")
            marks.append((block.start, marker.end()))
        elif indented_code and out and _is_note(text, out[-1]):
            block = replace(block, kind="paragraph")  # the note's continuation
        if block.kind in ("paragraph", "list_item", "table"):
            after = marker.end() if marker else block.start
            code = tuple(m.span() for m in _CODE_SPAN.finditer(text, after, block.end))
            references = _FOOTNOTE_REFERENCE.finditer(text, after, block.end)
            marks.extend(m.span() for m in references if not _inside(code, m.start()))
        out.append(block)
    return out, marks


def _is_note(text: str, block: Block) -> bool:
    """Whether ``block`` is a footnote definition (a paragraph opening with ``[^label]:``)."""
    return block.kind == "paragraph" and _FOOTNOTE_DEFINITION.match(text, block.start, block.end) is not None


def _inline_html(text: str, tokens: list[Any], opener: int, span: tuple[int, int]) -> list[tuple[int, int]]:
    """Character ranges of the inline HTML tags and comments of the block opened at ``tokens[opener]``.

    markdown-it gives inline tokens no offsets, but a tag's content is its raw
    text, so the tags are found in order from the block's start.
    """
    found = []
    cursor = span[0]
    depth = 0
    for token in tokens[opener:]:
        depth += token.nesting
        for child in token.children or ():
            if child.type == "html_inline":
                at = text.find(child.content, cursor, span[1])
                if at >= 0:
                    found.append((at, at + len(child.content)))
                    cursor = at + len(child.content)
        if depth <= 0 and token is not tokens[opener]:
            break
    return found


def _only_markup(text: str, span: tuple[int, int], tags: list[tuple[int, int]]) -> bool:
    """Whether ``text[span]`` holds nothing but the HTML ``tags`` and whitespace."""
    pieces, cursor = [], span[0]
    for start, end in tags:
        pieces.append(text[cursor:start])
        cursor = end
    pieces.append(text[cursor : span[1]])
    return not "".join(pieces).strip()


def parse_blocks(text: str) -> tuple[Block, ...]:
    """The blocks of ``text`` in order (see :class:`Block`): read as reStructuredText when it
    looks like it and not like Markdown (:func:`has_structure`), else as Markdown.

    Blank lines belong to no block; so do lines holding only a list or quote
    marker. Every other character of the text is inside exactly one block.
    """
    return _parsed(text)[0]


@dataclass(frozen=True)
class CopyLayout:
    """What of a structured text (Markdown, reStructuredText) may be copied, and from where.

    Attributes:
        hidden: sorted, disjoint ``(start, end)`` character ranges never copied:
            the hidden blocks (:data:`HIDDEN_KINDS`) and the markup inside copyable
            ones: inline HTML tags, footnote markers and references, a
            reStructuredText simple table's border lines.
        code: ``(start, end)`` of each code block (fence lines included).
        code_line_starts: the only offsets inside code where a copy may start:
            each code line's first non-blank character (a fence's opening line
            included, so a block can be copied whole; its closing line not).
        block_starts: the first character of each copyable block.
        heading_starts: the first character of each heading (where a section begins).
        hidden_cum: int32 (len(text) + 1,), cumulative count of non-whitespace
            hidden characters (a token's count is ``cum[end] - cum[start]``).
        visible_cum: int32 (len(text) + 1,), the same for all non-whitespace characters.
    """

    hidden: tuple[tuple[int, int], ...]
    code: tuple[tuple[int, int], ...]
    code_line_starts: frozenset[int]
    block_starts: tuple[int, ...]
    heading_starts: frozenset[int]
    hidden_cum: np.ndarray
    visible_cum: np.ndarray


def _code_line_starts(text: str, block: Block) -> list[int]:
    """First non-blank character of each line of a code block, but a fence's closing line."""
    body = text[block.start : block.end]
    starts = [block.start + m.start() + len(m.group()) - len(m.group().lstrip()) for m in re.finditer(r"[^\n]+", body) if m.group().strip()]
    if len(starts) > 1 and _BARE_FENCE.match(text, text.rfind("\n", 0, starts[-1]) + 1, block.end):
        starts.pop()
    return starts


@functools.lru_cache(maxsize=512)
def copy_layout(text: str, *, chunk: bool = True) -> CopyLayout | None:
    """The :class:`CopyLayout` of ``text``, or None when it has no block structure
    (:func:`has_structure`): then every token may be copied and seams are those of prose.
    ``chunk``: ``text`` may be a chunk cut out of a document, which can open inside a code
    block (:func:`_block_tokens`); False for a text read whole from its start, as a Markdown
    reader reads an answer."""
    if not has_structure(text):
        return None
    blocks, marks = _parsed(text, chunk)
    hidden = sorted([(b.start, b.end) for b in blocks if not b.copyable] + list(marks))
    code = [b for b in blocks if b.kind == "code"]
    mask = np.zeros(len(text), dtype=bool)
    for start, end in hidden:
        mask[start:end] = True
    visible = np.fromiter((not ch.isspace() for ch in text), dtype=bool, count=len(text))
    zero = np.zeros(1, dtype=np.int32)
    return CopyLayout(
        hidden=tuple(hidden),
        code=tuple((b.start, b.end) for b in code),
        code_line_starts=frozenset(s for b in code for s in _code_line_starts(text, b)),
        block_starts=tuple(b.start for b in blocks if b.copyable),
        heading_starts=frozenset(b.start for b in blocks if b.kind == "heading"),
        hidden_cum=np.concatenate([zero, np.cumsum(mask & visible, dtype=np.int32)]),
        visible_cum=np.concatenate([zero, np.cumsum(visible, dtype=np.int32)]),
    )


def readable_blocks(text: str) -> tuple[tuple[int, int], ...]:
    """``(start, end)`` of each block of ``text`` a reader sees (paragraphs, list items, tables,
    code), in order; empty when ``text`` has no block structure (:func:`has_structure`)."""
    if copy_layout(text) is None:
        return ()
    return tuple((b.start, b.end) for b in parse_blocks(text) if b.copyable)


def shows_text(text: str, start: int, end: int) -> bool:
    """Whether characters ``[start, end)`` of ``text`` hold one a reader sees: a non-blank
    character outside hidden markup (:class:`CopyLayout`); for prose, any non-blank one."""
    layout = copy_layout(text)
    if layout is None:
        return bool(text[start:end].strip())
    visible = layout.visible_cum[end] - layout.visible_cum[start]
    return bool(visible - (layout.hidden_cum[end] - layout.hidden_cum[start]) > 0)


def _inside(ranges: tuple[tuple[int, int], ...], pos: int) -> bool:
    return any(start <= pos < end for start, end in ranges)


def start_allowed(text: str, pos: int) -> bool:
    """Whether a copy may start at character ``pos`` (a non-blank character) of ``text``:
    never inside hidden markup, and inside a code block only at a line's first
    non-blank character. Always True for prose."""
    layout = copy_layout(text)
    if layout is None:
        return True
    if _inside(layout.hidden, pos):
        return False
    return pos in layout.code_line_starts or not _inside(layout.code, pos)


def _blank_and_hidden(layout: CopyLayout, char_spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bool (L,) twice: whether each token is whitespace only, and whether it holds a hidden character."""
    spans = np.asarray(char_spans, dtype=np.int64).reshape(-1, 2)
    starts, ends = spans[:, 0], spans[:, 1]
    blank = layout.visible_cum[ends] - layout.visible_cum[starts] == 0
    return blank, layout.hidden_cum[ends] - layout.hidden_cum[starts] > 0


def copyable_tokens(text: str, char_spans: np.ndarray) -> np.ndarray:
    """Which tokens of ``text`` may be copied: bool (L,) for int (L, 2) ``char_spans``.

    A token is hidden when one of its non-blank characters is hidden markup
    (:class:`CopyLayout`); a whitespace-only token takes the verdict of the
    next token that is not (of the previous one at the text's end), so a copy
    does not end on the blank line that leads into a heading. All True for prose.
    """
    layout = copy_layout(text)
    if layout is None or not len(char_spans):
        return np.ones(len(char_spans), dtype=bool)
    blank, hidden = _blank_and_hidden(layout, char_spans)
    if blank.all():
        return np.ones(len(blank), dtype=bool)
    index = np.arange(len(blank))
    following = np.minimum.accumulate(np.where(blank, len(blank), index)[::-1])[::-1]
    preceding = np.maximum.accumulate(np.where(blank, -1, index))
    verdict_of = np.where(following < len(blank), following, preceding)
    return ~hidden[verdict_of]


def copyable_end(text: str, char_spans: np.ndarray, pos: int, end: int) -> int:
    """The first token in ``[pos, end)`` that may not be copied (:func:`copyable_tokens`), or ``end``:
    where a draft starting at token ``pos`` must stop."""
    if end <= pos or copy_layout(text) is None:
        return end
    blocked = np.flatnonzero(~copyable_tokens(text, char_spans)[pos:end])
    return pos + int(blocked[0]) if len(blocked) else end


def missing_indentation(text: str, start: int, lead: str = "") -> str:
    """The part of a code line's indentation that lies before character ``start`` on its line,
    where a copy that opens at ``start`` begins inside it: ``"   "`` for a token ``" @click"`` on a
    line indented by four spaces (the tokenizer writes one space of them into the word's token, the
    rest into the line break's). ``""`` when ``start`` is at its line's start, after text on its
    line, not in the indentation of a line of code (:attr:`CopyLayout.code_line_starts`), or in
    a fence line's: a fence indented by four spaces, out of the list item that indented it, is
    no fence but a line of an indented block. ``text`` is read after ``lead``, as for
    :func:`open_code_block`: a chunk cut inside a literal block opens with lines that are code
    only below the ``::`` of a chunk before."""
    layout = copy_layout(lead + text)
    line_start = text.rfind("\n", 0, start) + 1
    before = text[line_start:start]
    if layout is None or not before or before.strip(" \t"):
        return ""
    first_shown = start + len(text[start:]) - len(text[start:].lstrip(" \t"))
    if len(lead) + first_shown not in layout.code_line_starts or _FENCE_LINE.match(text, first_shown):
        return ""
    return before


def section_ends_at(text: str, pos: int) -> bool:
    """Whether what follows character ``pos`` of ``text``, past white space and hidden markup
    (an anchor, a comment), is a heading: a copy that got to ``pos`` has finished its section.
    False for prose and at the end of the text."""
    layout = copy_layout(text)
    if layout is None:
        return False
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        if pos in layout.heading_starts:
            return True
        hidden = next((end for start, end in layout.hidden if start <= pos < end), None)
        if hidden is None:
            return False
        pos = hidden
    return False


def open_code_block(text: str, pos: int, lead: str = "") -> tuple[int, int] | None:
    """``(start, end)`` of the code block whose body a copy that got to character ``pos`` of
    ``text`` is inside: ``pos`` past the block's first character and before its closing
    fence line (or its end, for a block without one). None for prose and outside code.

    ``lead`` is the text a reader read before ``text`` in its document (the chunks before it,
    :func:`~nest_integrations.decoding.chunk_chain.text_read_before`; "" for none): ``text`` is read
    after it, so a chunk cut inside a block that a chunk before opens (a ``::`` paragraph, a
    code directive, a fence) is inside that block from its first character (the block then
    starts at 0). Read alone, its lines are code only when they read as code on their own
    (shell lines without a prompt do not)."""
    block = _code_block_around(lead + text, len(lead) + pos)
    return _in_text(block, lead)


def _in_text(block: tuple[int, int] | None, lead: str) -> tuple[int, int] | None:
    """``block``, found in ``lead`` and the text after it, in the text's own offsets: a block that
    ``lead`` opens starts at 0; None stays None."""
    return None if block is None else (max(block[0] - len(lead), 0), block[1] - len(lead))


def _code_block_around(text: str, pos: int) -> tuple[int, int] | None:
    """``(start, end)`` of the code block of ``text`` whose body character ``pos`` is in (past the
    block's first character, before its closing fence line), as :func:`open_code_block` reads it
    without a lead; None for prose and outside code. Its callers pass a lead joined before their
    text, so the start may lie in the lead: :func:`opening_fence` reads the opener there."""
    layout = copy_layout(text)
    if layout is None:
        return None
    for start, end in layout.code:
        if start < pos < end:
            fence = closing_fence(text, (start, end))
            return (start, end) if fence is None or pos <= fence[0] else None
    return None


def opening_fence(text: str, pos: int, lead: str = "", after: str = "") -> str | None:
    """The fence a copy opening at character ``pos`` of ``text`` needs above it to read as code in
    a Markdown answer, its block's opener being out of the copy; None when it needs none.

    * In a fenced block: the source's fence (three or more backticks or tildes), its opener lying
      before ``pos``, in ``text`` or in ``lead`` (the chunks before, as for
      :func:`open_code_block`: a chunk cut inside a block). Without it a Markdown reader reads
      the copied lines as prose and the source's closing fence as opening a block. Bare, without
      the opener's info string (```` ```js ````): what the decoder sets holds no word. None
      inside the opener's line (its line break is past it) or past the closing fence's start.
    * In a block without a fence of its own (:func:`unfenced_code_block`, read from the first
      character a reader sees at or after ``pos``) whose first line would read as prose after
      ``after``, the answer so far (:func:`reads_as_code_after`): ```` ``` ````. A block indented
      fewer than :data:`INDENTED_CODE_COLUMNS` reads so anywhere (:func:`shallow_code_block`); one
      indented four spaces reads so under a list item's text. The source has no closing fence to
      copy: the decoder sets one where the copy leaves the block.
    * None in prose and in a block without a fence that reads as code where the answer stands."""
    full, at = lead + text, len(lead) + pos
    block = _code_block_around(full, at)
    if block is not None and (opener := _FENCE_LINE.match(full, *block)) is not None:
        line_end = full.find("\n", block[0], block[1])
        return None if line_end < 0 or at < line_end else opener.group(1)
    if _unfenced_block(full, at) is None:
        return None
    shown = at + len(full[at:]) - len(full[at:].lstrip())
    line_start, line_end = full.rfind("\n", 0, shown) + 1, full.find("\n", shown)
    copied = full[min(at, line_start) : line_end if line_end >= 0 else None]  # its line breaks, its first line whole
    return None if reads_as_code_after(after, copied) else "```"


def code_block_at(text: str, pos: int, lead: str = "") -> tuple[int, int] | None:
    """``(start, end)`` of the code block of ``text`` (its fence lines included) that holds the
    first character a reader sees at or after ``pos``; None when that character is in prose or
    there is none. ``text`` is read after ``lead`` as for :func:`open_code_block` (a block that
    a chunk before opens starts at 0). Where a copy that opens at ``pos`` goes: into code, or
    out of it."""
    block = _block_at(lead + text, len(lead) + pos)
    return _in_text(block, lead)


def unfenced_code_block(text: str, pos: int, lead: str = "") -> tuple[int, int] | None:
    """:func:`code_block_at`, for a block without a fence of its own (indented, a ``::`` literal
    block, a code directive's body, a doctest); None for a fenced block or prose. Its source has no
    closing fence to copy: a copy of it that the decoder fences (:func:`opening_fence`) ends at the
    block's end, where the decoder closes the fence."""
    return _in_text(_unfenced_block(lead + text, len(lead) + pos), lead)


def shallow_code_block(text: str, pos: int, lead: str = "") -> tuple[int, int] | None:
    """:func:`unfenced_code_block`, for a block whose lines are indented fewer than
    :data:`INDENTED_CODE_COLUMNS`; None for any other. A copy of such a block reads as code only
    between fences the decoder sets, wherever the answer stands."""
    block = _shallow_block(lead + text, len(lead) + pos)
    return _in_text(block, lead)


@functools.lru_cache(maxsize=256)
def reads_as_code_after(text: str, copied: str) -> bool:
    """Whether the last line of ``copied`` (a line of code with its indentation, after the line
    breaks a copy brings before it) reads as code when set after ``text`` (an answer so far, read
    whole as a Markdown reader, CommonMark, reads it) where the decoder sets it: after the text
    before any block ``text`` leaves open (:func:`unclosed_fence`), with a paragraph break between
    them unless one of them brings a line break. An indented line under a list item's text reads
    as the item's next paragraph unless it is indented four columns past the item's text ("- much
    less disk space needed." and then ``    rm -rf chunks.archive.d``), and an indented line right
    under a paragraph's last line as that paragraph's; one indented four spaces after a blank
    line anywhere else reads as code. Cached: the proposer asks it for one opening several times."""
    block = _unclosed_block(text)
    head = text if block is None else text[: block[0]]
    joined = not head.strip() or head.endswith("\n") or copied.lstrip(" \t").startswith("\n")
    full = (head if head.strip() else "") + ("" if joined else "\n\n") + copied
    last = full.count("\n")
    return any(
        token.type in ("code_block", "fence") and token.map is not None and token.map[0] <= last < token.map[1]
        for token in _parser().parse(full)
    )


def shallow_code_entry(text: str, start: int, end: int, lead: str = "") -> int | None:
    """Where the white space before the first block of :func:`shallow_code_block` that opens
    inside characters ``[start, end)`` of ``text`` begins (the end of the ``::`` paragraph above
    it); None when none opens there. A copy of prose that would run on into such a block ends
    there, so that the decoder can set the block's fence above its code. ``lead`` as for
    :func:`open_code_block`."""
    full, offset = lead + text, len(lead)
    layout = copy_layout(full)
    for block_start, _ in layout.code if layout is not None else ():
        if offset + start < block_start < offset + end and _shallow_block(full, block_start) is not None:
            return max(len(full[:block_start].rstrip()) - offset, start)
    return None


def _block_at(text: str, pos: int) -> tuple[int, int] | None:
    """:func:`code_block_at` without a lead."""
    layout = copy_layout(text)
    shown = pos + len(text[pos:]) - len(text[pos:].lstrip())
    return None if layout is None else next(((start, end) for start, end in layout.code if start <= shown < end), None)


def _unfenced_block(text: str, pos: int) -> tuple[int, int] | None:
    """:func:`unfenced_code_block` without a lead."""
    block = _block_at(text, pos)
    return None if block is None or _FENCE_LINE.match(text, *block) else block


def _shallow_block(text: str, pos: int) -> tuple[int, int] | None:
    """:func:`shallow_code_block` without a lead."""
    block = _unfenced_block(text, pos)
    if block is None:
        return None
    lines = text[text.rfind("\n", 0, block[0]) + 1 : block[1]].expandtabs(INDENTED_CODE_COLUMNS).splitlines()
    return block if min(len(line) - len(line.lstrip()) for line in lines if line.strip()) < INDENTED_CODE_COLUMNS else None


def past_markup_indent(text: str, pos: int) -> int:
    """``pos``, or, when only white space that holds a line break stands between character ``pos``
    of ``text`` and an indented line of prose (the body of a directive such as ``.. seealso::``,
    under its hidden line), the first character of that line's text. A copy that goes on there
    past the hidden markup starts at the text: the indentation is the directive's syntax, and a
    Markdown reader renders prose indented four spaces as code. Code keeps its indentation, and
    so does a text without block structure."""
    layout = copy_layout(text)
    first = len(text) - len(text[pos:].lstrip())
    if layout is None or first >= len(text) or "\n" not in text[pos:first]:
        return pos
    if text.rfind("\n", pos, first) + 1 == first or _inside(layout.code, first):
        return pos
    return first


def below_hidden_line(text: str, pos: int) -> int:
    """``pos``, or, when character ``pos`` of ``text`` is the line break that ends a hidden block
    other than a heading (an admonition's ``:::{note}`` fence, a directive's line) and a block
    opens at the margin on the very next line (the admonition's body), that block's first
    character. A copy that opens there takes the text after a paragraph break: the one line break
    between would run the block into the paragraph above it, where a reader sees a block of its
    own. A table's next row under its hidden border line opens no block, a code block is set
    apart by its fence, and a heading's line break stays under the title an answer copies as its
    label."""
    layout = copy_layout(text)
    first = len(text) - len(text[pos:].lstrip())
    if layout is None or first >= len(text) or text.count("\n", pos, first) != 1 or first not in layout.block_starts:
        return pos
    if text.rfind("\n", pos, first) + 1 != first or _inside(layout.code, first):
        return pos  # indented (a directive's body, a nested block), or code, which its fence or indentation sets apart
    above = next((block for block in parse_blocks(text) if block.end == pos), None)
    return first if above is not None and not above.copyable and above.kind != "heading" else pos


def ends_in_code(text: str) -> bool:
    """Whether the last line of ``text`` (an answer so far, read whole as a Markdown reader reads
    it) that shows anything is a line of a code block, its fence lines included (a closing fence):
    text from elsewhere after it needs a line of its own, or it reads as more code (and after a
    fence on its line it keeps the block open)."""
    end = len(text.rstrip())
    layout = copy_layout(text, chunk=False) if end else None
    return layout is not None and any(start < end <= stop for start, stop in layout.code)


def closing_fence(text: str, block: tuple[int, int]) -> tuple[int, int] | None:
    """``(start, end)`` of the line break before the closing fence of the code ``block`` of
    ``text`` and the fence itself (what closes the block when copied after any of its lines);
    None for an indented block or a fenced one its text does not close (a chunk cut inside it)."""
    start, end = block
    line_start = text.rfind("\n", start, end) + 1
    if line_start <= start or not _BARE_FENCE.match(text, line_start, end):
        return None
    return line_start - 1, end


def _unclosed_block(text: str) -> tuple[int, int] | None:
    """``(start, end)`` of the fenced code block ``text`` ends inside (:func:`unclosed_fence`), its
    opener's line included; None when ``text`` ends outside one."""
    layout = copy_layout(text, chunk=False)
    if layout is None or not layout.code:
        return None
    start, end = layout.code[-1]
    if text[end:].strip() or _FENCE_LINE.match(text, start, end) is None or closing_fence(text, (start, end)) is not None:
        return None
    return start, end


def unclosed_fence(text: str) -> str | None:
    """The fence (three or more backticks or tildes, as its opener's) that closes the fenced code
    block ``text`` ends inside: a copy that stopped where a chunker cut the block leaves it open,
    and everything a Markdown reader sees after it would be code. ``text`` is an answer so far,
    read whole as that reader reads it: prose and then a diagram's bare opening fence is no chunk
    cut inside a block. None when ``text`` ends outside a fenced block (or inside an indented
    one, which needs no fence)."""
    block = _unclosed_block(text)
    return None if block is None else _FENCE_LINE.match(text, *block).group(1)  # type: ignore[union-attr]


def closing_fence_line(text: str) -> str | None:
    """What closes the fenced code block ``text`` ends inside (:func:`unclosed_fence`) on a line
    of its own: the fence, after a line break unless ``text`` ends in one; None when ``text``
    ends outside a fenced block."""
    fence = unclosed_fence(text)
    return None if fence is None else ("" if text.endswith("\n") else "\n") + fence


_HEADING_MARKS = re.compile(r"[ \t]*#{1,6}[ \t]+")
_CLOSING_MARKS = re.compile(r"[ \t]+#+[ \t]*$")
_UNDERLINE = re.compile(rf"[ \t]*({ADORNMENT_CHARACTER})\1*[ \t]*")
"""A line of one punctuation character: an underline or overline, not a title."""
_TAG = r"</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>\n]*)?/?>"
_LEADING_TAGS = re.compile(rf"(?:\s|{_TAG})*")
_TRAILING_TAGS = re.compile(rf"(?:\s|{_TAG})*\Z")
"""White space and HTML tags (``<a name="fail"></a>``) at a title's ends: a reader does not see them."""


def section_title(text: str, pos: int) -> tuple[int, int] | None:
    """``(start, end)`` of the title of the heading that character ``pos`` of ``text`` sits under:
    the nearest heading starting before ``pos``, as written (``"`customLevels` (Object)"``): an
    ATX heading's line less its ``#`` marks (and closing ones), an underlined title's line
    (reStructuredText, a Markdown Setext heading) without its underline or overline; HTML tags
    at its ends (an anchor) left out. None for
    prose and for a position no heading of ``text`` precedes (a chunk cut mid-section).

    The title is what a reader sees above the section, so an answer copied from the section may
    carry it as its label."""
    if copy_layout(text) is None:
        return None
    heading = next((b for b in reversed(parse_blocks(text)) if b.kind == "heading" and b.start < pos), None)
    if heading is None:
        return None
    for line in re.finditer(r"[^\n]+", text[heading.start : heading.end]):
        if _UNDERLINE.fullmatch(line.group()):
            continue
        start, end = heading.start + line.start(), heading.start + line.end()
        marks = _HEADING_MARKS.match(text, start, end)
        closing = _CLOSING_MARKS.search(text, start, end) if marks else None
        start, end = (marks.end() if marks else start), (closing.start() if closing else end)
        title = text[start:end]  # less the white space and tags (an anchor) at its ends
        lead = _LEADING_TAGS.match(title).end()  # type: ignore[union-attr]
        start, end = start + lead, start + _TRAILING_TAGS.search(title, lead).start()  # type: ignore[union-attr]
        return (start, end) if end > start else None
    return None


def label_start(text: str, char_spans: np.ndarray, title_first: int) -> int:
    """Where an answer that has copied something already starts copying a section's title as its
    label: back from ``title_first`` (the title's first token, of int (L, 2) ``char_spans``) over
    the heading's ``#`` marks, then over the whitespace-only tokens before them (the line breaks
    that set the title on a line of its own). :func:`title_tokens` copies those and the title,
    never the marks."""
    title_start = int(char_spans[title_first, 0])
    first = title_first
    while first > 0 and char_spans[first - 1, 1] <= title_start and text[slice(*char_spans[first - 1])].strip():
        first -= 1
    while first > 0 and not text[slice(*char_spans[first - 1])].strip():
        first -= 1
    return first


def title_tokens(text: str, char_spans: np.ndarray, first: int, last: int) -> list[int]:
    """Of tokens ``first..last`` (int (L, 2) ``char_spans``), which end with a heading's title
    (:func:`section_title`) and start at its first token or at the line breaks before it
    (:func:`label_start`), the ones an answer copies as the section's label: the line breaks
    and the title's own tokens, not the ``#`` marks, nor a token that also holds the end of an
    anchor before the title (``">."`` of ``<a name="fail"></a>.fail(fn)``)."""
    title = section_title(text, int(char_spans[last, 0]))
    title_start = title[0] if title is not None else int(char_spans[first, 0])
    return [
        i for i in range(first, last + 1)
        if not text[slice(*char_spans[i])].strip()
        or (char_spans[i, 1] > title_start and not text[char_spans[i, 0] : title_start].strip())
    ]


def first_copyable(text: str, char_spans: np.ndarray, pos: int) -> int:
    """The first token at or after ``pos`` a copy may start with: copyable, not whitespace
    only, and not mid-line in code nor on a closing fence (:func:`start_allowed`);
    ``len(char_spans)`` when none. Where a copy planned at a heading line (an answer's
    opening) really starts. ``pos`` itself for prose."""
    layout = copy_layout(text)
    if layout is None:
        return pos
    blank, hidden = _blank_and_hidden(layout, char_spans)
    for i in pos + np.flatnonzero(~(blank | hidden)[pos:]):
        start, end = (int(x) for x in char_spans[i])
        piece = text[start:end]
        if start_allowed(text, start + len(piece) - len(piece.lstrip())):
            return int(i)
    return len(blank)
