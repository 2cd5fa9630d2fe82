"""Which passages a documentation folder gets otherwise when it is chunked again with this release,
against an index that the release before built from it, without building anything.

``nest index build`` reads each file as Markdown or reStructuredText from its text; a
reStructuredText reference wrapped at its space (``:ref:`complete change history`` then
``<changes>``` first on the next line) was read as an HTML tag, and so the page as Markdown. The
folder is loaded and chunked as ``nest index build`` does with its defaults; passage ids that
are new, gone, or hold another text are listed.

    python results/acronym-runs-not-names/rechunk_check.py --out results/acronym-runs-not-names \\
        --domain coverage=benchmarks/domains/heldout/coverage/docs:IDX/coverage ...

A domain is ``NAME=FOLDER:INDEX``. Writes ``rechunk_check.json`` and prints a line a domain.
"""

from __future__ import annotations

import argparse
import json

from nest_benchmarks.report_files import domain_parser, domain_specs
from nest_integrations import NestIndex
from nest_integrations.corpus.chunking import DEFAULT_CHUNK_TOKENS, chunk_passages
from nest_integrations.corpus.loaders import load_corpus
from nest_integrations.model.lm import load_lm


def main() -> None:
    args = domain_parser(__doc__, "NAME=FOLDER:INDEX", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    tokenizer = load_lm().tokenizer
    report = {}
    for name, (folder, index_path) in domain_specs(args.domain).items():
        now = {p.id: p.text for p in chunk_passages(load_corpus(folder), max_tokens=DEFAULT_CHUNK_TOKENS, tokenizer=tokenizer)}
        before = {p.id: p.text for p in NestIndex.load(index_path).passages}
        changed = sorted(pid for pid in now.keys() | before.keys() if now.get(pid) != before.get(pid))
        report[name] = {"passages_before": len(before), "passages_now": len(now), "changed": changed}
        print(f"{name}: {len(before)} -> {len(now)} passages, {len(changed)} ids changed", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rechunk_check.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
