"""The block structure of reStructuredText passages.

Sphinx documentation (the docs folders of Python packages' sdists, Debian's ``*-doc``
packages) and many docstrings are reStructuredText. Read as prose, a section title's
underline (``=======``), a reference label (``.. _options:``) and a directive line
(``.. code-block:: python``) are copied into answers as if they were text, and the lines of a
code example read as sentences. This module reads the constructs that decide what a reader
sees, line by line, and returns the same :class:`~nest_integrations.corpus.blocks.Block`\\ s
as the Markdown reader, in character offsets into the original text:

* a section title: a line underlined, and maybe overlined, with one punctuation character
  repeated, the underline at least as long as the title or four characters long (shorter,
  docutils reads the two lines as text): ``"heading"``, levels in the order the styles first
  appear in the text;
* explicit markup, up to the next blank line: targets and substitutions
  (``.. _label:``, ``.. |name| image:: x``: ``"link_definition"``), comments (``..``
  followed by anything else: ``"comment"``), and directives (``.. name:: arguments``): the
  directive line and the option lines right under it are ``"directive"``; its body (the
  indented lines after a blank line, as far as they are indented like the first) is one
  ``"code"`` block for the code directives (:data:`CODE_DIRECTIVES`) and for a body that reads
  as code (:func:`reads_as_code`: a doctest, a shell prompt, or Python), otherwise the body's
  paragraphs are read like any others;
* literal blocks (the lines indented under a paragraph that ends in ``::``) and doctest
  blocks (``>>>`` lines): ``"code"``; a paragraph of ``::`` alone, which announces a literal
  block and shows nothing: ``"directive"``; so are the lines a text opens with when they are indented
  by four spaces or a tab (:data:`OPENS_INDENTED`) and read as code (:func:`reads_as_code`): a
  chunk cut inside a literal block or a directive's body shows neither the ``::`` nor the
  directive above them (a note's body cut the same way reads as text); the ``::`` that ends a
  paragraph of text reads as docutils shows it, its hidden characters marks (:meth:`_Reader.literal_marker`):
  "try::" reads "try:", "as follows ::" reads "as follows";
* grid tables (lines opening with ``+-`` or ``+=``): ``"table"``; simple tables (between
  border lines of ``=`` runs, ``=====  =====``): ``"table"``, their border lines and the ``-``
  runs under a header cell that spans columns hidden inside the block (:func:`parse_rst`):
  a reader sees the cells; a transition (a punctuation line standing alone): ``"rule"``;
* everything else: paragraphs, and list items (a line opening with ``-``, ``*``, ``+``, ``1.``
  or ``#.``), each ended by a blank line or by the next item.

A text is read this way when it shows one of these constructs (:func:`looks_like_rst`) and
no Markdown block syntax (:func:`~nest_integrations.corpus.markdown_structure.looks_like_markdown`
is asked first). Inline markup (``:func:`echo```, ````code````) stays text: a reader sees
its words.

docutils itself is not used: its document tree gives line numbers to only some nodes and no
character offsets, which citations need, and a chunk cut out of a document or a Sphinx
directive it does not know makes it report errors rather than read on.
"""

from __future__ import annotations

import ast
import re
import textwrap

from .blocks import ADORNMENT_CHARACTER, Block, BlockKind, line_starts, trimmed_range

CODE_DIRECTIVES: frozenset[str] = frozenset({
    "code", "code-block", "sourcecode", "doctest", "testcode", "testsetup", "testcleanup", "testoutput",
    "parsed-literal", "ipython", "jupyter-execute", "prompt", "code-tab",
})
"""Directives whose body is code (docutils' and Sphinx's own, and the common extensions': ``code-tab``
is sphinx-tabs' tab of one language's example)."""

_ADORNMENT = re.compile(rf"({ADORNMENT_CHARACTER})\1{{2,}}[ \t]*")
_UNDERLINED = re.compile(
    rf"(?:\A|\n[ \t]*\n)(?:(?P<over>{ADORNMENT_CHARACTER})(?P=over){{2,}}[ \t]*\n)?"
    rf"(?P<title>\S[^\n]*)\n(?P<under>(?P<char>{ADORNMENT_CHARACTER})(?P=char){{2,}})[ \t]*(?:\n|\Z)"
)
"""A title after a blank line or the text's start, underlined, maybe overlined first (a document's
title: ``"****\nREST Backend\n****"``)."""
_DIRECTIVE = re.compile(r"\.\.[ \t]+([A-Za-z0-9]+(?:[-_.:+][A-Za-z0-9]+)*)[ \t]?::(?:[ \t]|$)")
_TARGET = re.compile(r"\.\.[ \t]+(?:_[^\n]*:|\|[^|\n]+\|)")
_FOOTNOTE = re.compile(r"\.\.[ \t]+\[(?:[0-9]+|\*|#?(?:(?:(?!_)\w)+(?:[-._+:](?:(?!_)\w)+)*)?)\](?:[ \t]|$)")
"""A footnote or citation opening (docutils' labels: a number, ``#``, ``#name``, ``*`` or a simple
reference name), whose note is text a reader sees. Any other bracket after ``..`` opens a comment
that shows nothing: ``.. [[[cog show_help("run") ]]]``, the markers of generated sections."""
_EXPLICIT = re.compile(r"\.\.(?:[ \t]|$)")
_TABLE_BORDER = re.compile(r"[ \t]*=+(?:[ \t]+=+)+[ \t]*")
"""A simple table's border line: runs of ``=``, one a column, separated by spaces (above the
header, under it, at the table's end). The spaces set it apart from a title's underline."""
_TABLE_RULE = re.compile(r"[ \t]*([=-])\1*(?:[ \t]+\1+)*[ \t]*")
"""A line of a simple table that is markup, not cells: a border, or the ``-`` runs under a
header cell that spans columns."""
_SNIFF = re.compile(
    r"^[ \t]*\.\.(?:[ \t]+\S|[ \t]*$)"  # explicit markup: a directive, a target, a comment
    r"|::[ \t]*\n[ \t]*\n[ \t]+\S"  # a literal block under a paragraph
    r"|^[ \t]*=+(?:[ \t]+=+)+[ \t]*$",  # a simple table's border (_TABLE_BORDER)
    re.MULTILINE,
)
OPENS_INDENTED = re.compile(r"\A(?:[ \t]*\n)*(?: {4}|\t)[ \t]*\S")
"""A text whose first non-blank line is indented by four spaces or a tab: it opens inside an
indented block (a chunk of a document cut within its code)."""
_ITEM = re.compile(r"(?:[-*+]|\d+[.)]|#\.)[ \t]+\S")
_SHELL_OR_DOCTEST = re.compile(r"(?:\$|>>>|%)[ \t]")
_CODE_SIGN = re.compile(r"[(=@\[{]|^[ \t]*(?:import|from|def|class)\b", re.MULTILINE)


def _title_fits(title: str, adornment: str) -> bool:
    """docutils' rule: an underline shorter than its title and than four characters makes no title."""
    return len(adornment) >= len(title.rstrip()) or len(adornment) >= 4


def looks_like_rst(text: str) -> bool:
    """Whether ``text`` shows reStructuredText's block syntax: an underlined (maybe overlined) title, explicit
    markup (a line opening with ``..``: a directive, a target, a comment), a literal block
    under a ``::`` paragraph, a simple table's border line, or lines indented like code that
    the text opens with (:data:`OPENS_INDENTED`)."""
    if _SNIFF.search(text) or OPENS_INDENTED.match(text):
        return True
    return any(
        _title_fits(m["title"], m["under"]) and not _ADORNMENT.fullmatch(m["title"]) and m["over"] in (None, m["char"])
        for m in _UNDERLINED.finditer(text)
    )


def announces_code(line: str) -> bool:
    """Whether ``line`` is a directive whose body is code (``.. code-block:: console``,
    :data:`CODE_DIRECTIVES`) or a literal block's marker standing alone (``::``): the code it
    announces follows it, on the lines below."""
    if line.strip() == "::":
        return True
    directive = _DIRECTIVE.match(line.strip())
    return directive is not None and directive.group(1).lower() in CODE_DIRECTIVES


def reads_as_code(body: str) -> bool:
    """Whether a directive's ``body`` is code: it opens with a shell prompt or a doctest
    (``$ ``, ``>>> ``), or it parses as Python and shows a call, an assignment, a decorator, a
    literal or an import (a lone word parses too, and is no code)."""
    dedented = textwrap.dedent(body).strip()
    if _SHELL_OR_DOCTEST.match(dedented):
        return True
    try:
        ast.parse(dedented)
    except (SyntaxError, ValueError):
        return False
    return bool(_CODE_SIGN.search(dedented))


class _Reader:
    """One pass over the lines of a text, collecting its blocks (see the module docstring)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = line_starts(text)
        self.raw = [text[self.lines[i] : self.lines[i + 1]].rstrip("\n") for i in range(len(self.lines) - 1)]
        self.blank = [not line.strip() for line in self.raw]
        self.indent = [len(line) - len(line.lstrip()) for line in self.raw]
        self.blocks: list[Block] = []
        self.marks: list[tuple[int, int]] = []  # hidden ranges inside copyable blocks (table borders, a paragraph's ::)
        self.headings: list[tuple[int, str]] = []  # (level, title) of the enclosing titles
        self.styles: list[tuple[str, bool]] = []  # (character, overlined) of each title level

    def add(self, kind: BlockKind, first: int, stop: int, level: int = 0) -> None:
        span = trimmed_range(self.text, self.lines, first, stop)
        if span is not None:
            self.blocks.append(Block(kind, span[0], span[1], tuple(title for _, title in self.headings), level))

    def body_end(self, first: int) -> int:
        """The line after an indented body (code) that starts at line ``first``: its lines are blank
        or indented at least as far as its first one (trailing blank lines left out). A chunk may
        open inside a body, or a splitter may have cut away its first line's indentation, so the
        directive or paragraph above a body says less about where it ends than the body does."""
        stop = first
        while stop < len(self.raw) and (self.blank[stop] or self.indent[stop] >= self.indent[first]):
            stop += 1
        while stop > first and self.blank[stop - 1]:
            stop -= 1
        return stop

    def code_body(self, first: int, *, code: bool = False) -> int | None:
        """The indented body from line ``first`` (:meth:`body_end`) as one ``"code"`` block when it
        is code (``code``: a code directive's body, whatever it reads as) or reads as code
        (:func:`reads_as_code`): the line after it; None, and nothing added, when it reads as text."""
        stop = self.body_end(first)
        if not code and not reads_as_code(self.text[self.lines[first] : self.lines[stop]]):
            return None
        self.add("code", first, stop)
        return stop

    def paragraph_end(self, first: int) -> int:
        """The line after the run of non-blank lines from ``first``."""
        stop = first
        while stop < len(self.raw) and not self.blank[stop]:
            stop += 1
        return stop

    def table_end(self, i: int) -> int | None:
        """The line after a simple table that line ``i`` opens, or None when it opens none: the
        run of non-blank lines from ``i`` holds a border line (:data:`_TABLE_BORDER`; at ``i``
        for a whole table, further down for a chunk cut inside one). The table ends with the
        first border line followed by a blank line or the text's end (docutils' rule: the body
        may hold blank lines); a table that never closes (a chunk cut inside it) ends with the run."""
        run_stop = self.paragraph_end(i)
        if not any(_TABLE_BORDER.fullmatch(self.raw[j]) for j in range(i, run_stop)):
            return None
        for j in range(i, len(self.raw)):
            if _TABLE_BORDER.fullmatch(self.raw[j]) and (j + 1 == len(self.raw) or self.blank[j + 1]):
                return j + 1
        return run_stop

    def read_table(self, i: int, stop: int) -> int:
        """A simple table on lines ``[i, stop)``: one ``"table"`` block whose rule lines
        (:data:`_TABLE_RULE`) are hidden marks; a ``"rule"`` when it is nothing but those (the
        bottom border of a table a chunk was cut from)."""
        rules = [j for j in range(i, stop) if not self.blank[j] and _TABLE_RULE.fullmatch(self.raw[j])]
        if len(rules) == sum(not blank for blank in self.blank[i:stop]):
            self.add("rule", i, stop)
            return stop
        self.add("table", i, stop)
        for j in rules:
            span = trimmed_range(self.text, self.lines, j, j + 1)
            assert span is not None
            self.marks.append(span)
        return stop

    def title_at(self, i: int) -> tuple[int, str, tuple[str, bool]] | None:
        """``(lines, title, style)`` of a section title opening at line ``i`` (after a blank line or the text's start)."""
        raw, n = self.raw, len(self.raw)
        if i > 0 and not self.blank[i - 1]:
            return None
        over = _ADORNMENT.fullmatch(raw[i])
        if over and i + 2 < n and not self.blank[i + 1] and raw[i + 2].rstrip() == raw[i].rstrip():
            return 3, raw[i + 1].strip(), (over.group(1), True)
        if over or self.indent[i] or i + 1 >= n:
            return None
        under = _ADORNMENT.fullmatch(raw[i + 1])
        if under and _title_fits(raw[i], raw[i + 1].rstrip()):
            return 2, raw[i].strip(), (under.group(1), False)
        return None

    def read_title(self, i: int, title: tuple[int, str, tuple[str, bool]]) -> int:
        count, name, style = title
        if style not in self.styles:
            self.styles.append(style)
        level = min(self.styles.index(style) + 1, 6)
        self.headings = [h for h in self.headings if h[0] < level] + [(level, name)]
        self.add("heading", i, i + count, level)
        return i + count

    def read_explicit(self, i: int) -> int:
        """An explicit markup block at line ``i``; returns where reading goes on (inside a prose body)."""
        body = self.raw[i][self.indent[i] :]
        header_stop = self.paragraph_end(i)
        directive = _DIRECTIVE.match(body)
        if directive is None:
            self.add("link_definition" if _TARGET.match(body) else "comment", i, header_stop)
            return header_stop
        self.add("directive", i, header_stop)
        first = header_stop
        while first < len(self.raw) and self.blank[first]:
            first += 1
        if first == len(self.raw) or self.indent[first] <= self.indent[i]:
            return first  # no body
        stop = self.code_body(first, code=directive.group(1).lower() in CODE_DIRECTIVES)
        return first if stop is None else stop

    def read_paragraph(self, i: int) -> tuple[int, bool]:
        """A paragraph or list item from line ``i``: ``(next line, whether it ends in ::)``. It also
        ends before a line at its indentation that opens explicit markup: docutils reads such a
        line as text, but a chunk that starts inside a run of link targets (``.. _name: url``, one a
        line) has lost the line the run began with, and the rest are targets, not a paragraph."""
        base = self.indent[i]
        stop = i + 1
        while stop < len(self.raw) and not self.blank[stop] and self.indent[stop] >= base:
            rest = self.raw[stop][base:]
            if self.indent[stop] == base and (_ITEM.match(rest) or (_EXPLICIT.match(rest) and not _FOOTNOTE.match(rest))):
                break
            stop += 1
        kind: BlockKind = "list_item" if _ITEM.match(self.raw[i][base:]) else "paragraph"
        if stop == i + 1 and self.raw[i].strip() == "::":
            kind = "directive"  # the literal block's marker written alone: docutils shows nothing of it
        self.add(kind, i, stop)
        literal = self.raw[stop - 1].rstrip().endswith("::")
        if literal and kind != "directive":
            self.marks.append(self.literal_marker(stop - 1))
        return stop, literal

    def literal_marker(self, j: int) -> tuple[int, int]:
        """The characters of the ``::`` that ends line ``j`` (a paragraph announcing a literal
        block) that docutils does not show: the second colon after text ("try::" shows as
        "try:"), or both and the white space before them ("as follows ::" as "as follows")."""
        line = self.raw[j].rstrip()
        end = self.lines[j] + len(line)
        before = line[:-2]
        if before.rstrip() != before:
            return self.lines[j] + len(before.rstrip()), end
        return end - 1, end

    def read(self) -> tuple[Block, ...]:
        raw, n = self.raw, len(self.raw)
        literal_base: int | None = None  # indentation of the paragraph that announced a literal block
        i = 0
        if OPENS_INDENTED.match(self.text):  # the body of a block whose start the text does not show
            i = next(j for j in range(n) if not self.blank[j])
            stop = self.code_body(i)
            i = i if stop is None else stop
        while i < n:
            if self.blank[i]:
                i += 1
                continue
            line, indent = raw[i], self.indent[i]
            if literal_base is not None and indent > literal_base:
                stop = self.body_end(i)
                self.add("code", i, stop)
                i, literal_base = stop, None
                continue
            literal_base = None
            body = line[indent:]
            title = self.title_at(i)
            if title is not None:
                i = self.read_title(i, title)
            elif _EXPLICIT.match(body) and not _FOOTNOTE.match(body):
                i = self.read_explicit(i)
            elif body.startswith((">>>", "+-", "+=")):
                stop = self.paragraph_end(i)
                self.add("code" if body.startswith(">>>") else "table", i, stop)
                i = stop
            elif (table_stop := self.table_end(i)) is not None:
                i = self.read_table(i, table_stop)
            elif _ADORNMENT.fullmatch(line) and (i + 1 >= n or self.blank[i + 1]):
                self.add("rule", i, i + 1)
                i += 1
            else:
                i, literal = self.read_paragraph(i)
                literal_base = indent if literal else None
        return tuple(self.blocks)


def parse_rst(text: str) -> tuple[tuple[Block, ...], tuple[tuple[int, int], ...]]:
    """``(blocks, marks)`` of ``text`` read as reStructuredText: its blocks in order (see the
    module docstring; blank lines belong to no block, every other character is inside exactly
    one block) and the sorted ``(start, end)`` character ranges of the markup inside copyable
    blocks a reader does not see (a simple table's border lines, what a paragraph's closing ``::`` hides)."""
    reader = _Reader(text)
    blocks = reader.read()
    return blocks, tuple(sorted(reader.marks))
