"""Which passages of each index this release reads as reStructuredText and the release before did
not: a title with an overline, where the overline opens the text or follows a blank line, and
nothing else in the passage that reads as reStructuredText or Markdown.

The release before's test is spelled out here (:func:`read_as_rst_before`): it found an underlined
title only right after a blank line or at the text's start, so an overline there hid its title.

    python results/acronym-runs-not-names/overline_check.py --out results/acronym-runs-not-names \\
        --domain restic=IDX/restic ...

A domain is ``NAME=INDEX``. Writes ``overline_check.json`` and prints a line a domain.
"""

from __future__ import annotations

import argparse
import json
import re

from nest_benchmarks.report_files import domain_parser, domain_specs
from nest_integrations import NestIndex
from nest_integrations.corpus.blocks import ADORNMENT_CHARACTER
from nest_integrations.corpus.markdown_structure import looks_like_markdown
from nest_integrations.corpus.rst_structure import OPENS_INDENTED, looks_like_rst

BEFORE_UNDERLINED = re.compile(rf"(?:\A|\n[ \t]*\n)(\S[^\n]*)\n(({ADORNMENT_CHARACTER})\3{{2,}})[ \t]*(?:\n|\Z)")
BEFORE_OTHER_SIGNS = re.compile(r"^[ \t]*\.\.(?:[ \t]+\S|[ \t]*$)|::[ \t]*\n[ \t]*\n[ \t]+\S|^[ \t]*=+(?:[ \t]+=+)+[ \t]*$", re.MULTILINE)
ADORNMENT_LINE = re.compile(rf"({ADORNMENT_CHARACTER})\1{{2,}}[ \t]*")


def read_as_rst_before(text: str) -> bool:
    """The release before's ``looks_like_rst``: explicit markup, a literal block, a simple table's
    border, an indented opening, or a title underlined right after a blank line or the start."""
    if BEFORE_OTHER_SIGNS.search(text) or OPENS_INDENTED.match(text):
        return True
    return any(
        (len(m.group(2)) >= len(m.group(1).rstrip()) or len(m.group(2)) >= 4) and not ADORNMENT_LINE.fullmatch(m.group(1))
        for m in BEFORE_UNDERLINED.finditer(text)
    )


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report = {}
    for name, (index_path,) in domain_specs(args.domain).items():
        passages = NestIndex.load(index_path).passages
        changed = [p.id for p in passages if not looks_like_markdown(p.text) and looks_like_rst(p.text) != read_as_rst_before(p.text)]
        report[name] = {"passages": len(passages), "read_otherwise": changed}
        print(f"{name}: {len(changed)} of {len(passages)} passages read otherwise {changed}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overline_check.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
