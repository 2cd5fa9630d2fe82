"""Candidate answer windows that run over a heading, per index, with the code on the path.

A heading's line is never copied, so a window over one is scored on words its copy does not
show. For every passage of each index: its candidate windows
(:func:`nest_integrations.policy.selection.candidate_windows`) and those with a heading of the
passage starting inside them, with one example each.

    python results/windows-within-sections/windows_over_headings.py --out results/windows-within-sections/after \\
        --domain attrs=IDX/attrs --domain borg=IDX/borg ...

Run with the release before on ``PYTHONPATH`` for the figures before the change. A domain is
``NAME=INDEX``. Writes ``windows_over_headings.json`` and ``windows_over_headings.md``.
"""

from __future__ import annotations

import argparse

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_integrations import NestIndex
from nest_integrations.corpus.markdown_structure import copy_layout
from nest_integrations.policy.selection import candidate_windows


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report: dict = {}
    for name, (index_path,) in domain_specs(args.domain).items():
        windows, over = 0, []
        for passage in NestIndex.load(index_path).passages:
            layout = copy_layout(passage.text)
            for c in candidate_windows([passage]):
                windows += 1
                if layout is not None and any(c.start < h < c.end for h in layout.heading_starts):
                    over.append({"passage": passage.id, "text": passage.text[c.start : c.end]})
        report[name] = {"windows": windows, "over_a_heading": len(over), "examples": over[:3]}
    rows = [[name, d["windows"], d["over_a_heading"], repr(d["examples"][0]["text"][:80]).replace("|", "\\|") if d["examples"] else "–"] for name, d in report.items()]
    write_report(args.out, "windows_over_headings", report, markdown_table(["index", "candidate windows", "over a heading", "first of them"], rows))


if __name__ == "__main__":
    main()
