"""Whether the lines an answer copies from a source's code read as code in the answer, without
generating: read from generated answers (``nest eval``'s ``items.jsonl``, or ``nest generate
--output`` JSONL) and the index they were copied from.

For each copied span, each of its lines that shows text and lies inside a code block of its
source (read with every chunk before it in its document: ``open_code_block``) is looked up in
the answer as a Markdown reader reads it (markdown-it, CommonMark): a line outside every fenced
or indented block there reads as prose, and the block's closing fence, copied after it, may
then open a block that swallows what follows.

    python results/code-blocks-across-chunks/code_lines_rendered.py --index IDX/attrs \\
        --items results/code-blocks-across-chunks/every-domain/attrs/items.jsonl

Prints, per file, the code lines copied and those read as prose, and the answers that hold any.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_integrations import NestIndex
from nest_integrations.corpus.markdown_structure import open_code_block
from nest_integrations.decoding.chunk_chain import text_read_before


def whole_lead(index: NestIndex, pidx: int) -> str:
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


def answer_counts(index: NestIndex, output: dict) -> tuple[int, int]:
    """Code lines of its sources ``output`` copies, and those of them it shows as prose."""
    text, copied, prose = output["text"], 0, 0
    code = code_ranges(text)
    for span in output.get("spans") or []:
        source = span.get("source") or {}
        pidx = index.datastore.index_of(source.get("id", "")) if span.get("copied") else None
        if pidx is None or source.get("chunk_char_start") is None:
            continue
        passage, lead = index.datastore.passages[pidx], whole_lead(index, pidx)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="the index the answers copied from")
    parser.add_argument("--items", type=Path, nargs="+", required=True, help="items.jsonl or generation JSONL files")
    args = parser.parse_args()
    index = NestIndex.load(args.index)
    for path in args.items:
        total, as_prose, answers = 0, 0, []
        for line in path.read_text().splitlines():
            item = json.loads(line)
            output = item.get("output", item)
            copied, prose = answer_counts(index, output)
            total, as_prose = total + copied, as_prose + prose
            if prose:
                answers.append(item.get("item_id") or item.get("id"))
        print(f"{path}: {total} code lines copied, {as_prose} read as prose; answers: {', '.join(answers) or 'none'}")


if __name__ == "__main__":
    main()
