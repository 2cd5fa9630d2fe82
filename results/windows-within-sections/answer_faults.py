"""Answers that show a reader markup or the same copied text twice, before and after a change,
without generating.

For each domain, every answer of the runs given (``nest eval``'s ``items.jsonl`` in a run folder),
each mode on its own: the answers whose copied spans take markup from their sources
(:func:`nest_benchmarks.metrics.copied_markup`, with today's markup patterns, so the runs before
and after are scored alike) and the answers that hold one copied text twice: a copied span of
:data:`MIN_REPEAT_CHARS` characters or more (white space aside) that another copied span of the
answer holds, from another source or from the same one.

    python results/windows-within-sections/answer_faults.py --out results/windows-within-sections \\
        --domain borg=IDX/borg:results/code-under-list-items/every-domain/borg:results/windows-within-sections/every-domain/borg ...

A domain is ``NAME=INDEX:BEFORE:AFTER`` (run folders). Writes ``answer_faults.json`` (per domain
and mode, the ids of the answers with each fault, before and after) and ``answer_faults.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_benchmarks.metrics import copied_markup
from nest_benchmarks.report_files import domain_parser, markdown_table, score_before_after, write_report
from nest_integrations import NestIndex

MIN_REPEAT_CHARS = 60
"""Characters (white space aside) a copied text needs to count when it is copied twice: a line of
code, not a shared word or a closing fence."""


def copies_twice(output: dict) -> bool:
    """Whether one copied span's text (white space aside, :data:`MIN_REPEAT_CHARS` or more) is held
    by another copied span of ``output``."""
    texts = ["".join(span["text"].split()) for span in output["spans"] if span.get("copied")]
    return any(
        len(text) >= MIN_REPEAT_CHARS and other.find(text) >= 0
        for i, text in enumerate(texts)
        for j, other in enumerate(texts)
        if i != j
    )


def run_faults(index: NestIndex, run: Path) -> dict[str, dict[str, list[str]]]:
    """Per mode of the answers in ``run``: the ids of those that copy ``markup`` (with its kinds)
    and of those that copy one text ``twice``."""
    faults: dict[str, dict[str, list[str]]] = {}
    passages = {p.id: p.text for p in index.passages}
    for line in (run / "items.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        mode = faults.setdefault(item["mode"], {"answers": [], "markup": [], "twice": []})
        mode["answers"].append(item["item_id"])
        kinds = copied_markup(item["output"], passages)
        if kinds:
            mode["markup"].append(f"{item['item_id']} ({', '.join(kinds)})")
        if copies_twice(item["output"]):
            mode["twice"].append(item["item_id"])
    return faults


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:BEFORE:AFTER", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report = score_before_after(args.domain, NestIndex.load, run_faults)
    rows = [
        [
            name, mode, len(then["answers"]), len(then["markup"]), len(now["markup"]), len(then["twice"]), len(now["twice"]),
            "; ".join(then["markup"] + [f"twice: {a}" for a in then["twice"]]) or "–",
            "; ".join(now["markup"] + [f"twice: {a}" for a in now["twice"]]) or "–",
        ]
        for name, runs in report.items()
        for mode, then in runs["before"].items()
        for now in [runs["after"][mode]]
    ]
    header = ["domain", "mode", "answers", "copy markup, before", "after", "copy a text twice, before", "after", "answers before", "answers after"]
    write_report(args.out, "answer_faults", report, markdown_table(header, rows))

if __name__ == "__main__":
    main()
