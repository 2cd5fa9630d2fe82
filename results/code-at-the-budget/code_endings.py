"""How nest's answers end when they end inside code: counted over ``nest eval`` runs.

For every nest / ra_nest answer of each run folder (one ``items.jsonl`` each), read as a
CommonMark renderer reads it (markdown-it):

* ``ends_in_code``: the answer's last block is a code block (fenced or indented);
* ``fence_left_open``: that block is fenced and no closing fence ends it (the renderer shows
  everything after it as code);
* ``line_cut``: the answer ends inside code, not at a line break, its last span is copied, and
  its source document goes on with more of that line (the source text right after the span is
  not a line break).

    python results/code-at-the-budget/code_endings.py --out results/code-at-the-budget \\
        before=results/code-cut-by-chunks after=results/code-at-the-budget

Each argument is ``LABEL=FOLDER`` (a folder of run folders). Writes ``code_endings.json`` and
``code_endings.md`` (one row per run, one column group per label).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from pathlib import Path
from typing import Any, Optional

from markdown_it import MarkdownIt

_CLOSING_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")


def last_block(text: str) -> Optional[Any]:
    """The markdown-it block token of ``text``'s last block that reaches its last line, or None."""
    last_line = len(text.rstrip("\n").split("\n")) - 1
    tokens = [t for t in MarkdownIt("commonmark").parse(text) if t.map is not None and t.level == 0]
    return tokens[-1] if tokens and tokens[-1].map[1] > last_line else None


def fence_left_open(text: str, block: Any) -> bool:
    """Whether fenced ``block`` (the last of ``text``) has no closing fence line."""
    lines = text.rstrip("\n").split("\n")
    closing = _CLOSING_FENCE.fullmatch(lines[-1])
    return not (len(lines) - 1 > block.map[0] and closing and closing.group(1).startswith(block.markup))


@functools.lru_cache(maxsize=None)
def document_text(document: str, document_id: str) -> Optional[str]:
    """The text of a span's source document: a file on disk, or a bundled benchmark document."""
    path = Path(document)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    from nest_benchmarks.docs_corpus import module_document
    from nest_benchmarks.markdown_docs import fastify_documents, pino_documents

    if document.startswith("fastify@"):
        docs = {d.id: d.text for d in fastify_documents()}
    elif document.startswith("pino@"):
        docs = {d.id: d.text for d in pino_documents()}
    elif document == "python-stdlib-docstrings":
        return module_document(document_id).text
    else:
        return None
    return docs.get(document_id)


def ending(output: dict) -> dict[str, bool]:
    """``ends_in_code``, ``fence_left_open`` and ``line_cut`` of one output (see the module docstring)."""
    text = output["text"]
    block = last_block(text) if text.strip() else None
    in_code = block is not None and block.type in ("fence", "code_block")
    open_fence = in_code and block.type == "fence" and fence_left_open(text, block)
    cut = False
    spans = output.get("spans") or []
    if in_code and not text.endswith("\n") and spans and spans[-1].get("copied") and spans[-1].get("source"):
        location = spans[-1]["source"].get("location") or {}
        source = document_text(location.get("document", ""), location.get("document_id", ""))
        end = location.get("char_end")
        cut = source is not None and end is not None and end < len(source) and source[end] != "\n"
    return {"ends_in_code": in_code, "fence_left_open": open_fence, "line_cut": cut}


def count(run: Path) -> dict[str, int]:
    """Counts over the nest / ra_nest answers of one run folder."""
    totals = {"answers": 0, "ends_in_code": 0, "fence_left_open": 0, "line_cut": 0}
    for line in (run / "items.jsonl").open():
        item = json.loads(line)
        if item["mode"] not in ("nest", "ra_nest"):
            continue
        totals["answers"] += 1
        for key, value in ending(item["output"]).items():
            totals[key] += value
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=FOLDER of run folders")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    labelled = [tuple(arg.split("=", 1)) for arg in args.runs]
    names = sorted({p.parent.name for _, folder in labelled for p in Path(folder).glob("*/items.jsonl")})
    table = {name: {label: count(Path(folder) / name) for label, folder in labelled if (Path(folder) / name / "items.jsonl").exists()} for name in names}
    table = {name: row for name, row in table.items() if any(r["answers"] for r in row.values())}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "code_endings.json").write_text(json.dumps(table, indent=1) + "\n")
    labels = [label for label, _ in labelled]
    keys = ("ends_in_code", "fence_left_open", "line_cut")
    head = "| run | answers | " + " | ".join(f"{k.replace('_', ' ')} ({' / '.join(labels)})" for k in keys) + " |"
    rows = [head, "|" + "---|" * (2 + len(keys))]
    for name, row in table.items():
        answers = next(iter(row.values()))["answers"]
        rows.append(f"| {name} | {answers} | " + " | ".join(" / ".join(str(row[l][k]) if l in row else "-" for l in labels) for k in keys) + " |")
    (args.out / "code_endings.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
