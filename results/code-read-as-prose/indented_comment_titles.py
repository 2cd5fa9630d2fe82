"""Texts read as Markdown before a ``# Title`` had to open at the margin, and not now, without
generating.

Before, a line ``#`` and text indented up to three spaces with a blank line after it was a
Markdown title to the sniff (``markdown_structure.looks_like_markdown``): a bash or Python comment
indented three spaces in a reStructuredText code block made its whole page Markdown. The sniff of
the release before is this release's or that line, so a text is read otherwise exactly when it
holds such a line and this release does not sniff it as Markdown.

    python results/code-read-as-prose/indented_comment_titles.py --out results/code-read-as-prose \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/docs ... --domain setuptools=IDX/setuptools:DOCS/setuptools

A domain is ``NAME=INDEX:FOLDER``: the index's passages (what the decoder reads) and the folder's
documents (what ``nest index build`` chunks, as Markdown along its sections or as prose by
sentences; ``-`` for none) are read. Writes ``indented_comment_titles.json`` (per domain: texts
read, and those read otherwise) and ``indented_comment_titles.md``.
"""

from __future__ import annotations

import argparse
import re

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_integrations import NestIndex
from nest_integrations.corpus.loaders import load_documents
from nest_integrations.corpus.markdown_structure import looks_like_markdown

INDENTED_TITLE = re.compile(r"^ {1,3}#[ \t]+\S[^\n]*\n[ \t]*(?:\n|\Z)", re.MULTILINE)
"""The title the sniff of the release before read and this release's does not: indented one to
three spaces, a blank line (or the text's end) after it."""


def read_otherwise(texts: dict[str, str]) -> list[str]:
    """The ids of ``texts`` (id -> text) the release before read as Markdown and this one does not."""
    return [key for key, text in texts.items() if INDENTED_TITLE.search(text) and not looks_like_markdown(text)]


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:FOLDER", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report: dict = {}
    rows = []
    for name, (index_path, folder) in domain_specs(args.domain).items():
        passages = {p.id: p.text for p in NestIndex.load(index_path).passages}
        documents = {p.id: p.text for p in load_documents(folder)} if folder != "-" else {}
        report[name] = {
            "passages": len(passages), "passages_read_otherwise": read_otherwise(passages),
            "documents": len(documents), "documents_read_otherwise": read_otherwise(documents),
        }
        entry = report[name]
        rows.append([
            name, entry["passages"], len(entry["passages_read_otherwise"]), entry["documents"] or "–",
            ", ".join(f"`{d}`" for d in entry["documents_read_otherwise"]) or ("0" if documents else "–"),
        ])
    header = ["domain", "passages", "read otherwise", "documents", "documents read otherwise (Markdown before, now not)"]
    write_report(args.out, "indented_comment_titles", report, markdown_table(header, rows))


if __name__ == "__main__":
    main()
