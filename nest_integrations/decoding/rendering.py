"""Showing an output's attribution: cited documents, markers placed in Markdown, three renderers.

:func:`cited_documents` lists the documents an output copied from, once each,
numbered in order of first use; the renderers (:func:`render_markdown`,
:func:`render_html`, :func:`render_terminal`) and the integrations' citations
all number them so. :func:`place_markers` puts ``[n]`` markers into Markdown
where a renderer shows them (never in code) and keeps fences closed.
"""

from __future__ import annotations

import functools
import html
import re
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from pydantic import BaseModel, Field

from .output import NestOutput, SourceLocation, Span

if TYPE_CHECKING:  # pragma: no cover
    from markdown_it import MarkdownIt
    from markdown_it.token import Token


# --------------------------------------------------------------------------- cited documents
class DocumentNumbers:
    """Numbers documents 1, 2, ... in order of first use: the ``n`` of a ``[n]`` marker.

    One instance numbers one answer; a stream feeds its spans as they come and
    gets the numbers of the whole answer (first use does not depend on what follows).
    """

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def number(self, location: SourceLocation) -> int:
        """The number of ``location``'s document (a new one gets the next number)."""
        return self._numbers.setdefault(location.document_id, len(self._numbers) + 1)


class CitedDocument(BaseModel):
    """One document an answer copied from, with every range it cites there."""

    number: int = Field(description="1-based, in order of first use in the answer: the n of its [n] markers.")
    document: str = Field(description="The document's name (SourceLocation.document).")
    document_id: str = Field(description="What its offsets index (SourceLocation.document_id).")
    title: str = Field("", description="The title of the first passage cited from it ('' when none).")
    locations: list[SourceLocation] = Field(
        default_factory=list, description="The cited ranges in order of use; adjacent ones joined, repeats left out."
    )

    @property
    def extra_title(self) -> str:
        """The title when it says something the document's name does not, else ``""``."""
        return self.title if self.title and self.title not in self.document else ""

    def ranges(self) -> str:
        """The cited ranges in words: ``lines 12-14, chars 340-420; line 20, chars 600-640``."""
        return "; ".join(location.describe() for location in self.locations)

    def describe(self) -> str:
        """``docs/os.md: lines 12-14, chars 340-420; ...``, with :attr:`extra_title` in
        parentheses after the name."""
        name = f"{self.document} ({self.extra_title})" if self.extra_title else self.document
        return f"{name}: {self.ranges()}"


def cited_documents(spans: Iterable[Span]) -> list[CitedDocument]:
    """The documents the copied ``spans`` cite, once each, numbered in order of first use."""
    numbers = DocumentNumbers()
    documents: dict[int, CitedDocument] = {}
    for span in spans:
        if not span.copied or span.source is None:
            continue
        location = span.source.location
        n = numbers.number(location)
        entry = documents.setdefault(
            n, CitedDocument(number=n, document=location.document, document_id=location.document_id, title=span.source.title)
        )
        last = entry.locations[-1] if entry.locations else None
        if last is not None and last.char_end is not None and last.char_end == location.char_start:
            entry.locations[-1] = last.joined(location)
        elif location not in entry.locations:
            entry.locations.append(location)
    return list(documents.values())


def source_listing(output: NestOutput) -> list[str]:
    """The sources of ``output`` as lines ``[n] document: ranges``, numbered in order of first use
    (what :func:`render_terminal` and the LangChain ``cite`` runnable print)."""
    return [f"[{doc.number}] {doc.describe()}" for doc in cited_documents(output.spans)]


MODEL_MARK = "[model]"
"""What every renderer puts after text the LM wrote itself, as ``[n]`` after copied text: a
reader must not take an invented line between two copies for a cited one."""

MODEL_NOTE = f"{MODEL_MARK} written by the language model, not copied from any source"
"""The line that explains :data:`MODEL_MARK` under an answer that has some."""


def model_written(output: NestOutput, span: Span) -> bool:
    """Whether ``span`` is text the LM wrote that reads as part of the answer: not copied, with
    a letter or digit (a comma or a line break between two copies is not marked), and not the
    abstention of an output that says nothing answers (``finish_reason`` ``"not_covered"``)."""
    return not span.copied and any(ch.isalnum() for ch in span.text) and output.stats.finish_reason != "not_covered"


def model_note(output: NestOutput) -> Optional[str]:
    """:data:`MODEL_NOTE` when ``output`` has text the LM wrote (:func:`model_written`), else None."""
    return MODEL_NOTE if any(model_written(output, span) for span in output.spans) else None


# --------------------------------------------------------------------------- Markdown layout
_BARE_FENCE = re.compile(r"^[ \t>]*(`{3,}|~{3,})[ \t]*$")


@functools.lru_cache(maxsize=1)
def _markdown_parser() -> "MarkdownIt":
    """CommonMark with tables, built once (parsing keeps no state in it)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table")


def _line_offsets(text: str) -> list[int]:
    """Offset of each line's first character, then ``len(text)``: a token's line map ``[a, b)`` is
    the characters ``[offsets[a], offsets[b])`` (indices clipped to the list)."""
    return [0, *(m.end() for m in re.finditer("\n", text)), len(text)]


def _chars(offsets: list[int], line_map: Sequence[int]) -> tuple[int, int]:
    """The character range ``[a, b)`` of a token's line map (see :func:`_line_offsets`)."""
    last = len(offsets) - 1
    return offsets[min(line_map[0], last)], offsets[min(line_map[1], last)]


def _container_indent(prefix: str) -> str:
    """What a line needs before it to stay in the list items and quotes a line starting with
    ``prefix`` sits in: the quote marks kept, list markers turned into spaces."""
    return re.sub(r"[^\s>]", " ", prefix)


def _closing_fence(text: str, token: "Token", lo: int, hi: int) -> Optional[str]:
    """None when the fence ``token`` (characters ``[lo, hi)`` of ``text``) ends with a closing
    fence line; else the line that would close it: its opener's indentation (and block-quote
    marks) and fence."""
    lines = text[lo:hi].split("\n")
    body = [line for line in lines[1:] if line.strip()]
    closer = _BARE_FENCE.match(body[-1]) if body else None
    if closer is not None and closer.group(1)[0] == token.markup[0] and len(closer.group(1)) >= len(token.markup):
        return None
    return _container_indent(lines[0][: lines[0].index(token.markup)]) + token.markup


def _code_regions(
    text: str, tokens: Sequence["Token"], offsets: list[int]
) -> tuple[list[tuple[int, int, str, bool]], list[tuple[int, int]]]:
    """Where a marker would be shown as code (or raw HTML): the code and HTML blocks of ``text``
    as ``(a, b, prefix, blank)`` (characters ``[a, b)``; ``prefix``: the indentation and
    block-quote marks a line after the block needs to stay in the block's container; ``blank``:
    whether that line needs a blank line before it, as after an HTML block, which runs to one)
    and its inline code spans as ``(a, b)`` (:func:`_code_spans`)."""
    blocks, spans = [], []
    for token in tokens:
        if token.map is None:
            continue
        if token.type in ("fence", "code_block", "html_block"):
            lo, hi = _chars(offsets, token.map)
            first = text[lo:hi].split("\n", 1)[0]
            if token.level == 0:  # at the top level a line needs nothing before it
                lead = ""
            elif token.type == "fence":
                lead = _container_indent(first[: first.index(token.markup)])
            elif token.type == "html_block":
                lead = _container_indent(first[: len(first) - len(first.lstrip(" \t>"))])
            else:  # an indented code block: its indentation less the four spaces that make it code
                lead = _container_indent(first[: len(first) - len(first.lstrip(" \t>"))])[:-4]
            blocks.append((lo, hi, lead, token.type == "html_block"))
        elif token.type == "inline":
            spans.extend(_code_spans(text, *_chars(offsets, token.map)))
    return blocks, spans


def _code_spans(text: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """The inline code spans of the block ``text[lo:hi]`` as ``(a, b)``, paired as CommonMark
    pairs backtick runs: an opening run (without a first backtick escaped by a backslash) takes
    the next run of the same length (backslashes are literal inside code); a run without a
    partner is literal text."""
    runs = [(lo + m.start(), lo + m.end()) for m in re.finditer("`+", text[lo:hi])]
    spans = []
    i = 0
    while i < len(runs):
        start, end = runs[i]
        start += (start - lo - len(text[lo:start].rstrip("\\"))) % 2  # an escaped first backtick
        partner = next((j for j in range(i + 1, len(runs)) if runs[j][1] - runs[j][0] == end - start), None)
        if start == end or partner is None:
            i += 1
            continue
        spans.append((start, runs[partner][1]))
        i = partner + 1
    return spans


def _marker_offset(text: str, where: int, code_spans: Sequence[tuple[int, int]]) -> int:
    """``where``, moved past the inline code span it is inside and past the backtick run it
    would split (two runs either side of a marker could pair into a code span around it); before
    a backslash that escapes what follows it (after it, the marker would take the escape)."""
    if (where - len(text[:where].rstrip("\\"))) % 2:
        where -= 1
    while True:
        inside = [hi for lo, hi in code_spans if lo < where < hi]
        if inside:
            where = inside[0]
        elif 0 < where < len(text) and text[where - 1] == "`" == text[where]:
            where += len(text[where:]) - len(text[where:].lstrip("`"))
        else:
            return where


def _close_open_fences(text: str, cited: list[tuple[int, int, str]]) -> tuple[str, list[tuple[int, int, str]]]:
    """``text`` with every fenced code block closed by a fence line, and ``cited`` moved along.

    A fence a cited span opens is closed after the line that span ends on, so
    what follows reads as Markdown again (were it code, it now reads as text:
    shown, not swallowed); another one where its block ends (the end of the
    text, or of the list item or quote holding it). ``cited``: ``(start, end,
    marker)`` of each cited span.
    """
    parser = _markdown_parser()
    tried: set[int] = set()
    # Each fence of the text needs one closing line; a closing line a container misreads as an
    # opener is not chased further than the text's own lines.
    for _ in range(text.count("\n") + 1):
        offsets = _line_offsets(text)
        tokens = [t for t in parser.parse(text) if t.type == "fence" and t.map is not None]
        unclosed = [(lo, hi, fence) for t in tokens for lo, hi in [_chars(offsets, t.map)] if (fence := _closing_fence(text, t, lo, hi))]
        pending = [entry for entry in unclosed if entry[0] not in tried]
        if not pending:
            return text, cited
        line, at, fence = pending[0]
        tried.add(line)  # a closing line that does not take (a container misread) is not retried
        opened = text.index(fence.lstrip(" \t>"), line)  # the opening fence itself
        for start, end, _marker in cited:
            if start <= opened < end:
                newline = text.find("\n", end - 1)
                at = min(at, len(text) if newline < 0 else newline + 1)
                break
        closing = ("" if at == 0 or text[at - 1] == "\n" else "\n") + fence + "\n"
        text = text[:at] + closing + text[at:]
        cited = [(a + len(closing) * (a >= at), b + len(closing) * (b >= at), m) for a, b, m in cited]
    return text, cited


def _emphasis_allowed(text: str, a: int, b: int, code: Iterable[tuple[int, int]]) -> bool:
    """Whether ``**`` around ``text[a:b]`` renders as bold and changes nothing else: one line of
    plain text (no backslash to escape a star) outside code, not opening a line (where it could be a list or heading marker), and
    with edges that CommonMark lets open and close emphasis."""
    piece = text[a:b]
    if not piece or any(ch in piece for ch in "\n`*_\\") or any(lo < b and a < hi for lo, hi in code):
        return False
    line_start = text.rfind("\n", 0, a) + 1
    if not text[line_start:a].strip() and not piece[0].isalnum():
        return False
    before, after = text[a - 1 : a], text[b : b + 1]
    return not (before.isalnum() and not piece[0].isalnum()) and not (after.isalnum() and not piece[-1].isalnum())


def place_markers(pieces: Sequence[tuple[str, Optional[str]]], emphasize: bool = False) -> str:
    """Join ``pieces`` (``(text, marker)``: the marker goes after the text; None for none) into
    Markdown whose markers a renderer shows.

    A marker never lands in code: one that would end inside inline code goes
    after the code span, one inside a code block on its own line after the
    block (indented like the block's fence). A fence a cited piece opens and
    nothing closes is closed after that piece's last line, so it cannot
    swallow the rest of the answer; a fence left open elsewhere is closed
    where its block ends (:func:`_close_open_fences`). With ``emphasize`` the
    marked pieces are also bold where that is safe (:func:`_emphasis_allowed`).
    Whitespace at a piece's end stays after its marker.
    """
    text, cited, at = "", [], 0
    for piece, marker in pieces:
        text += piece
        if marker is not None:
            cited.append((at, at + len(piece), marker))
        at += len(piece)
    text, cited = _close_open_fences(text, cited)
    return _insert(text, _insertions(text, cited, emphasize))


def _insertions(text: str, cited: list[tuple[int, int, str]], emphasize: bool) -> dict[int, list[tuple[str, Any]]]:
    """Where each cited span's marker (and bold) goes in ``text``: ``offset -> [(kind, value)]``,
    kind ``"close"`` / ``"open"`` (``**``), ``"inline"`` (a marker) or ``"line"`` (``(marker,
    indentation, blank line before)``: a marker on its own line after a block)."""
    blocks, code_spans = _code_regions(text, _markdown_parser().parse(text), _line_offsets(text))
    code = [*((lo, hi) for lo, hi, _, _ in blocks), *code_spans]
    inserts: dict[int, list[tuple[str, Any]]] = {}
    for start, end, marker in cited:
        core_end = start + len(text[start:end].rstrip())
        core_start = core_end - len(text[start:core_end].strip())
        if core_start == core_end:  # copied whitespace: nothing to mark
            continue
        if emphasize and _emphasis_allowed(text, core_start, core_end, code):
            inserts.setdefault(core_start, []).append(("open", "**"))
            inserts.setdefault(core_end, []).append(("close", "**"))
        where = _marker_offset(text, core_end, code_spans)
        entry: tuple[str, Any] = ("inline", marker)
        for lo, hi, prefix, blank in blocks:
            if lo < where <= hi:  # in the block, or right after its last character (a fence line ending the text)
                where, entry = hi, ("line", (marker, prefix, blank))
        inserts.setdefault(where, []).append(entry)
    return inserts


def _insert(text: str, inserts: dict[int, list[tuple[str, Any]]]) -> str:
    """``text`` with the :func:`_insertions` made; at one offset: closing ``**``, inline markers,
    the marker line, opening ``**``. A marker repeated at one offset is written once."""
    out, last = [], 0
    for where in sorted(inserts):
        out.append(text[last:where])
        kinds = {kind: [value for k, value in inserts[where] if k == kind] for kind in ("close", "inline", "line", "open")}
        out.extend(kinds["close"] + _unique(kinds["inline"]))
        if kinds["line"]:
            _, prefix, blank = kinds["line"][0]
            ending = len(text[:where]) - len(text[:where].rstrip("\n"))  # newlines already before it
            before = "" if where == 0 else "\n" * max((2 if blank else 1) - ending, 0)
            # A marker line at the top level stands apart; one in a list item or quote keeps it going.
            apart = not prefix and not text.startswith("\n", where)
            after = "" if where == len(text) else "\n\n" if apart else "\n"
            out.append(before + prefix + "".join(_unique([marker for marker, _, _ in kinds["line"]])) + after)
        out.extend(kinds["open"])
        last = where
    out.append(text[last:])
    return "".join(out)


def _unique(items: list[str]) -> list[str]:
    """``items`` without repeats of the item just before (``[1][1]`` reads as ``[1]``)."""
    return [item for i, item in enumerate(items) if i == 0 or items[i - 1] != item]


# --------------------------------------------------------------------------- renderers
def marked_spans(output: NestOutput, marker: Callable[[int], str], model_marker: str = MODEL_MARK) -> list[tuple[str, Optional[str]]]:
    """``(span text, marker)`` per span, for :func:`place_markers`: a copied span gets
    ``marker(n)``, ``n`` the number of its document (:class:`DocumentNumbers`); text the LM
    wrote (:func:`model_written`) gets ``model_marker``."""
    numbers = DocumentNumbers()
    marked: list[tuple[str, Optional[str]]] = []
    for span in output.spans:
        if span.copied and span.source is not None:
            marked.append((span.text, marker(numbers.number(span.source.location))))
        else:
            marked.append((span.text, model_marker if model_written(output, span) else None))
    return marked


def _markdown_text(text: str) -> str:
    """``text`` with the characters Markdown or HTML would read as markup backslash-escaped."""
    return re.sub(r"([\\`*_\[\]<>#|!&])", r"\\\1", text)


def _markdown_code(text: str) -> str:
    """``text`` as Markdown inline code (fenced with more backticks than it holds)."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def render_markdown(output: NestOutput) -> str:
    """Markdown: copied spans in bold (where that is safe) followed by ``[n]``, text the LM wrote
    followed by :data:`MODEL_MARK`, then the sources.

    ``[n]`` numbers the cited documents in order of first use
    (:func:`cited_documents`); the markers are escaped brackets, so no renderer
    takes them for links or footnotes, and :func:`place_markers` keeps them out
    of code. The sources follow as a list: ``[n]`` the document, then each cited
    range's lines and characters.
    """
    body = place_markers(marked_spans(output, lambda n: f"\\[{n}\\]", _markdown_text(MODEL_MARK)), emphasize=True)
    documents = cited_documents(output.spans)
    note = model_note(output)
    if not documents and note is None:
        return body
    items = []
    for doc in documents:
        name = _markdown_code(doc.document) + (f" ({_markdown_text(doc.extra_title)})" if doc.extra_title else "")
        items.append(f"- \\[{doc.number}\\] {name}: {doc.ranges()}")
    if note is not None:
        items.append(f"- {_markdown_text(note)}")
    return body.rstrip() + "\n\nSources:\n\n" + "\n".join(items) + "\n"


def render_html(output: NestOutput) -> str:
    """HTML: copied spans highlighted with a hover title naming the document and its lines,
    numbered superscripts, text the LM wrote in grey italics marked :data:`MODEL_MARK`, then the
    numbered sources."""
    numbers = DocumentNumbers()
    parts = ['<div class="nest-output" style="line-height:1.6">']
    for span in output.spans:
        text = html.escape(span.text)
        if span.copied and span.source is not None:
            location = span.source.location
            n = numbers.number(location)
            title = html.escape(f"[{n}] {location.document}: {location.describe()}")
            parts.append(f'<mark style="background:#cfe8ff" title="{title}">{text}</mark><sup>[{n}]</sup>')
        elif model_written(output, span):
            parts.append(
                f'<span class="nest-model" style="color:#666;font-style:italic" title="{html.escape(MODEL_NOTE)}">{text}</span>'
                f"<sup>{MODEL_MARK}</sup>"
            )
        else:
            parts.append(text)
    parts.append("</div>")
    documents = cited_documents(output.spans)
    if documents:
        parts.append("<ol>" + "".join(f"<li>{html.escape(doc.describe())}</li>" for doc in documents) + "</ol>")
    if (note := model_note(output)) is not None:
        parts.append(f'<p class="nest-model-note" style="color:#666">{html.escape(note)}</p>')
    return "".join(parts)


def render_terminal(output: NestOutput) -> Any:
    """A rich renderable: copied spans highlighted with ``[n]`` after them, text the LM wrote in
    italics with :data:`MODEL_MARK` after it, then the numbered sources."""
    from rich.console import Group
    from rich.text import Text

    numbers = DocumentNumbers()
    body = Text()
    for span in output.spans:
        written = model_written(output, span)
        body.append(span.text, style="bold cyan" if span.copied else "italic" if written else None)
        if span.copied and span.source is not None:
            body.append(f"[{numbers.number(span.source.location)}]", style="dim cyan")
        elif written:
            body.append(MODEL_MARK, style="dim yellow")
    listing = source_listing(output) + [note for note in [model_note(output)] if note is not None]
    return Group(body, Text("\n".join(listing), style="dim")) if listing else body
