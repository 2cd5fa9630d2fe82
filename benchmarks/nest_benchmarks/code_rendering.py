"""Whether the lines an answer copies from a source's code read as code in the answer.

A line copied from inside a code block of its source (read with every chunk before it in its
document, as the decoder reads it) that a Markdown reader (markdown-it, CommonMark) shows outside
every fenced or indented block of the answer reads as prose: a reStructuredText body indented
three spaces copied without a fence, or an example's lines after the fence was left out. Read
from generated answers and the index they were copied from; nothing is generated.
"""

from __future__ import annotations

from typing import Any, Mapping

from nest_integrations import NestIndex
from nest_integrations.corpus.markdown_structure import open_code_block
from nest_integrations.decoding.chunk_chain import text_read_before

__all__ = ["code_lines_read_as_prose", "code_ranges"]


def _whole_lead(index: NestIndex, pidx: int) -> str:
    """Every chunk of passage ``pidx``'s document before it, as a reader read them."""
    store = index.datastore
    return text_read_before(store.passages, store.preceding_chunk, pidx, chunks=len(store.passages))


def code_ranges(answer: str) -> list[tuple[int, int]]:
    """``[start, end)`` character ranges of ``answer``'s code blocks (fenced or indented) as
    CommonMark reads the whole answer."""
    from markdown_it import MarkdownIt

    starts = [0]
    for line in answer.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return [
        (starts[t.map[0]], starts[min(t.map[1], len(starts) - 1)])
        for t in MarkdownIt("commonmark").parse(answer) if t.type in ("fence", "code_block") and t.map
    ]


def code_lines_read_as_prose(index: NestIndex, output: Mapping[str, Any]) -> tuple[int, int]:
    """``(copied, as_prose)``: the lines that show text which ``output`` (the output contract:
    ``text`` and ``spans``) copies from inside code blocks of its sources in ``index``, and how
    many of them a Markdown reader shows as prose in ``output["text"]``. A line is inside a block
    as :func:`~nest_integrations.corpus.markdown_structure.open_code_block` reads it (past the
    block's first character): the first line of a block without a fence is not counted."""
    text, copied, prose = output["text"], 0, 0
    code = code_ranges(text)
    for span in output.get("spans") or []:
        source = span.get("source") or {}
        pidx = index.datastore.index_of(source.get("id", "")) if span.get("copied") else None
        if pidx is None or source.get("chunk_char_start") is None:
            continue
        passage, lead = index.datastore.passages[pidx], _whole_lead(index, pidx)
        offset = 0
        for line in span["text"].splitlines(keepends=True):
            shown = len(line) - len(line.lstrip())
            at = source["chunk_char_start"] + offset + shown
            if line.strip() and open_code_block(passage.text, at, lead) is not None:
                copied += 1
                where = span["start"] + offset + shown
                prose += not any(start <= where < end for start, end in code)
            offset += len(line)
    return copied, prose
