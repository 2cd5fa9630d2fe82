"""Copied code a Markdown reader shows as prose, before and after a change, without generating.

For each domain, every answer of the runs given (``nest eval``'s ``items.jsonl`` in a run folder,
or ``nest generate --output`` JSONL), each mode on its own: the lines that show text which the
answers copy from inside code blocks of their sources, how many of them a Markdown reader
(markdown-it, CommonMark) shows as prose, and the answers that hold any
(:func:`nest_benchmarks.code_rendering.code_lines_read_as_prose`).

    python results/code-read-as-prose/code_read_as_prose.py --out results/code-read-as-prose \\
        --domain attrs=IDX/attrs:results/code-blocks-across-chunks/every-domain/attrs:results/code-read-as-prose/every-domain/attrs ...

A domain is ``NAME=INDEX:BEFORE:AFTER`` (run folders or JSONL files). Writes
``code_read_as_prose.json`` (per domain and mode: lines copied and read as prose, and the answers
that hold any, before and after) and ``code_read_as_prose.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_benchmarks.code_rendering import code_lines_read_as_prose
from nest_benchmarks.report_files import domain_parser, markdown_table, score_before_after, write_report
from nest_integrations import NestIndex


def run_counts(index: NestIndex, run: Path) -> dict[str, dict]:
    """Per mode of the answers in ``run`` (a run folder or a JSONL file): ``copied`` and
    ``as_prose`` code lines, and the ids of the ``answers`` that hold a line read as prose."""
    path = run / "items.jsonl" if run.is_dir() else run
    counts: dict[str, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        copied, prose = code_lines_read_as_prose(index, item.get("output", item))
        mode = counts.setdefault(item.get("mode", "nest"), {"copied": 0, "as_prose": 0, "answers": []})
        mode["copied"] += copied
        mode["as_prose"] += prose
        if prose:
            mode["answers"].append(item.get("item_id") or item.get("id"))
    return counts


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:BEFORE:AFTER", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report = score_before_after(args.domain, NestIndex.load, run_counts)
    rows = [
        [
            name, mode, f"{then['as_prose']} of {then['copied']}", f"{now['as_prose']} of {now['copied']}",
            len(then["answers"]), len(now["answers"]), ", ".join(f"`{a}`" for a in now["answers"]) or "–",
        ]
        for name, runs in report.items()
        for mode, then in runs["before"].items()
        for now in [runs["after"].get(mode, {"copied": 0, "as_prose": 0, "answers": []})]
    ]
    header = ["domain", "mode", "read as prose before (of code lines)", "after", "answers before", "after", "answers after"]
    write_report(args.out, "code_read_as_prose", report, markdown_table(header, rows))

if __name__ == "__main__":
    main()
