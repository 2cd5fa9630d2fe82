"""How far back the decoder must read a document to know in which code block a chunk opens
(``decoding.chunk_chain.text_read_before``), without generating.

For every chunk of every index given that goes on from another chunk of its document, the chunk's
first character is read after the ``k`` chunks before it, for k = 1, 2, 4 and 8, and after every
chunk before it (the whole document up to the chunk): the fence that opens the block it starts
inside (``opening_fence``, what the decoder sets above a copy that opens there) and whether it is
inside code at all (``open_code_block``, what keeps the model from writing in copied code). A
chunk counts where reading k chunks back gives another answer than reading the whole document.

    python results/code-blocks-across-chunks/chunks_read_back.py --out results/code-blocks-across-chunks \\
        --index attrs=IDX/attrs --index fastify=CACHE/markdown-docs-cli-a7cc94e37d42 ...

Writes ``chunks_read_back.json`` and a Markdown table, ``chunks_read_back.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_integrations import NestIndex
from nest_integrations.corpus.markdown_structure import open_code_block, opening_fence
from nest_integrations.decoding.chunk_chain import text_read_before

DEPTHS = (1, 2, 4, 8)
"""Chunks read back, compared with the whole document."""


def reading_at_start(text: str, lead: str) -> tuple[str | None, bool]:
    """The fence that opens the block ``text``'s first visible character is inside, read after
    ``lead``, and whether that character is inside a code block."""
    pos = len(text) - len(text.lstrip())
    return opening_fence(text, pos, lead), open_code_block(text, pos, lead) is not None


def index_counts(index: NestIndex) -> dict:
    """Chunks with a chunk before them, and for each depth those read otherwise than after the whole document."""
    store, passages = index.datastore, index.datastore.passages
    counts = {"chunks_after_another": 0, **{f"differ_at_{k}": 0 for k in DEPTHS}, "examples": []}
    for i, passage in enumerate(passages):
        if store.preceding_chunk(i) is None:
            continue
        counts["chunks_after_another"] += 1
        whole = reading_at_start(passage.text, text_read_before(passages, store.preceding_chunk, i, chunks=len(passages)))
        for k in DEPTHS:
            read = reading_at_start(passage.text, text_read_before(passages, store.preceding_chunk, i, chunks=k))
            if read != whole:
                counts[f"differ_at_{k}"] += 1
                if k == 1:
                    counts["examples"].append({"id": passage.id, "one_chunk_back": read, "whole_document": whole})
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", action="append", required=True, metavar="NAME=PATH", help="an index folder, named")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = {}
    for spec in args.index:
        name, path = spec.split("=", 1)
        report[name] = index_counts(NestIndex.load(path))
        print(name, {k: v for k, v in report[name].items() if k != "examples"}, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chunks_read_back.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = ["| index | chunks after another | " + " | ".join(f"read otherwise {k} back" for k in DEPTHS) + " |", "|---|---:|" + "---:|" * len(DEPTHS)]
    rows += [f"| {name} | {c['chunks_after_another']} | " + " | ".join(str(c[f'differ_at_{k}']) for k in DEPTHS) + " |" for name, c in report.items()]
    total = {key: sum(c[key] for c in report.values()) for key in ["chunks_after_another", *(f"differ_at_{k}" for k in DEPTHS)]}
    rows.append(f"| all | {total['chunks_after_another']} | " + " | ".join(str(total[f'differ_at_{k}']) for k in DEPTHS) + " |")
    (args.out / "chunks_read_back.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
