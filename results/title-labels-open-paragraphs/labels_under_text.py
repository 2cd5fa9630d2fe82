"""Section titles an answer copies as labels on the line right under its text, before and after a change, without generating.

An answer that copies a window of another section copies that section's title above it, as its
label. Set on the line right under a paragraph or a list item, with no blank line between, a
reader (and Markdown) reads the title as that paragraph's or item's last line: "... the final
output type.\\nInflection (camel-cased keys)" renders "... the final output type. Inflection
(camel-cased keys)". For each domain, every answer of the runs given (``nest eval``'s
``items.jsonl`` in a run folder), each mode on its own: the answers with a copied title label
(a copied span whose first character a reader sees lies in the title of a heading of its source
passage, :func:`~nest_integrations.corpus.markdown_structure.section_title`: a label may leave out
a first character that shares its token with an anchor, ``.`` after ``<a name="options"></a>``) after text that
ends in fewer than two line breaks.

    python results/title-labels-open-paragraphs/labels_under_text.py --out results/title-labels-open-paragraphs \\
        --domain marshmallow=IDX/marshmallow:results/windows-within-sections/every-domain/marshmallow:results/title-labels-open-paragraphs/every-domain/marshmallow ...

A domain is ``NAME=INDEX:BEFORE:AFTER`` (run folders). Writes ``labels_under_text.json`` (per
domain and mode, the ids of the answers with such a label and the label, before and after) and
``labels_under_text.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_benchmarks.report_files import domain_parser, markdown_table, score_before_after, write_report
from nest_integrations import NestIndex
from nest_integrations.corpus.markdown_structure import section_title


def labels_under_text(output: dict, passages: dict[str, str]) -> list[str]:
    """The copied title labels of ``output`` that follow its text so far after fewer than two line
    breaks (the answer's first label, with no text before it, aside)."""
    found, text = [], ""
    for span in output["spans"]:
        source = span.get("source") if span.get("copied") else None
        shown = len(span["text"]) - len(span["text"].lstrip())
        if isinstance(source, dict) and source.get("id") in passages and span["text"].strip():
            passage = passages[source["id"]]
            first = int(source["chunk_char_start"]) + shown
            title = section_title(passage, first + 1)
            before = text + span["text"][:shown]
            if title is not None and title[0] <= first < title[1] and before.strip() and before[len(before.rstrip()) :].count("\n") < 2:
                found.append(passage[title[0] : title[1]])
        text += span["text"]
    return found


def run_labels(index: NestIndex, run: Path) -> dict[str, dict[str, list[str]]]:
    """Per mode of the answers in ``run``: their ids, and ``"id: label"`` of each label under text."""
    labels: dict[str, dict[str, list[str]]] = {}
    passages = {p.id: p.text for p in index.passages}
    for line in (run / "items.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        mode = labels.setdefault(item["mode"], {"answers": [], "under text": []})
        mode["answers"].append(item["item_id"])
        mode["under text"] += [f"{item['item_id']}: {label}" for label in labels_under_text(item["output"], passages)]
    return labels


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:BEFORE:AFTER", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report = score_before_after(args.domain, NestIndex.load, run_labels)
    rows = [
        [name, mode, len(then["answers"]), len(then["under text"]), len(now["under text"]),
         "; ".join(then["under text"]) or "–", "; ".join(now["under text"]) or "–"]
        for name, runs in report.items()
        for mode, then in runs["before"].items()
        for now in [runs["after"][mode]]
    ]
    header = ["domain", "mode", "answers", "labels under text, before", "after", "before", "after"]
    write_report(args.out, "labels_under_text", report, markdown_table(header, rows))

if __name__ == "__main__":
    main()
