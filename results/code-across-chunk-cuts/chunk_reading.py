"""How many chunks read their code differently when read after the chunk before them.

For every passage of an index that goes on from another chunk of its document
(``Passage.continued_by``), compares the code blocks ``copy_layout`` finds in its first 400
characters read alone with those found when it is read after that chunk
(``chunk_chain.text_before``), and the same for hidden markup. Writes ``chunk_reading.json`` and
``chunk_reading.md`` into ``--out``::

    python results/code-across-chunk-cuts/chunk_reading.py --out results/code-across-chunk-cuts \
        --index attrs=IDX/attrs --index yargs=IDX/yargs ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_integrations.corpus.markdown_structure import copy_layout
from nest_integrations.corpus.passages import Passage
from nest_integrations.decoding.chunk_chain import text_before

OPENING = 400
"""Characters of a chunk compared: the part a chunk before it can change the reading of."""


def _opening(ranges: tuple[tuple[int, int], ...], shift: int, length: int) -> tuple[tuple[int, int], ...]:
    """``ranges`` of a text read after ``shift`` characters of lead, in the chunk's own
    coordinates and cut to its first :data:`OPENING` characters."""
    out = []
    for start, end in ranges:
        start, end = max(start - shift, 0), min(end - shift, length, OPENING)
        if end > 0 and start < OPENING:
            out.append((start, end))
    return tuple(out)


def read_index(path: Path) -> dict:
    passages = [Passage.from_dict(json.loads(line)) for line in (path / "passages.jsonl").open()]
    by_document: dict[str, list[int]] = {}
    for i, passage in enumerate(passages):
        if passage.doc_id:
            by_document.setdefault(passage.doc_id, []).append(i)
    chained = code = hidden = 0
    examples = []
    for indices in by_document.values():
        indices.sort(key=lambda i: passages[i].doc_char_start)
        for before, here in zip(indices, indices[1:]):
            if not passages[before].continued_by(passages[here]):
                continue
            chained += 1
            lead, text = text_before(passages, before, here), passages[here].text
            alone, after = copy_layout(text), copy_layout(lead + text)
            pick = lambda layout, field, shift: _opening(getattr(layout, field), shift, len(text)) if layout else ()
            if pick(alone, "code", 0) != pick(after, "code", len(lead)):
                code += 1
                examples.append(passages[here].id)
            hidden += pick(alone, "hidden", 0) != pick(after, "hidden", len(lead))
    return {"passages": len(passages), "chained": chained, "code_differs": code, "hidden_differs": hidden, "examples": examples[:5]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--index", action="append", required=True, help="NAME=INDEX_FOLDER")
    args = parser.parse_args()
    table = {name: read_index(Path(path)) for name, _, path in (spec.partition("=") for spec in args.index)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chunk_reading.json").write_text(json.dumps(table, indent=2) + "\n")
    rows = ["| index | passages | chunks that go on from another | code read differently | hidden markup read differently | e.g. |", "|---|---|---|---|---|---|"]
    for name, r in table.items():
        rows.append(f"| {name} | {r['passages']} | {r['chained']} | {r['code_differs']} | {r['hidden_differs']} | {', '.join(f'`{e}`' for e in r['examples'][:3])} |")
    total = [sum(r[k] for r in table.values()) for k in ("passages", "chained", "code_differs", "hidden_differs")]
    rows.append(f"| all | {total[0]} | {total[1]} | {total[2]} | {total[3]} | |")
    (args.out / "chunk_reading.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
