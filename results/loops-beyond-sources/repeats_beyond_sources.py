"""Answers the evaluation's repetition check flags, under its rule before and after a copied
repetition became the source's, scored from stored answers without generating.

The check flags an answer that repeats a word 4-gram three times or copies the same source
characters twice (``nest_benchmarks.metrics.is_repetitive``). Before, every occurrence of the
4-gram counted, so an answer that copies three changelog entries, each ending in a link to
``https://github.com/yargs/yargs/issues/...``, read as a loop. Now occurrences copied from
different places of the sources are the sources' own repetition; an answer loops when it repeats
the 4-gram more than its sources do (``repeated_ngram`` with ``copied``). The re-copy rule is
the same in both.

For each run (``nest eval``'s ``items.jsonl`` in a run folder), each mode on its own: the answers
flagged by each rule, the flagged ids that the new rule clears, and the first two 4-grams they repeat.

    python results/loops-beyond-sources/repeats_beyond_sources.py --out results/loops-beyond-sources \\
        --domain yargs=IDX/yargs:results/answered-at-the-budget/every-domain/yargs ...

A domain is ``NAME=INDEX:RUN``; ``INDEX`` gives the passages' places in their documents, so that
overlapping chunks of one document are one source, as in ``nest eval``. Writes
``repeats_beyond_sources.json`` and ``repeats_beyond_sources.md``.
"""

from __future__ import annotations

import argparse
import json
from itertools import islice
from pathlib import Path

from nest_benchmarks.metrics import is_repetitive, recopied_source, repeated_ngram, repeated_ngrams
from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.runner import doc_positions_of
from nest_integrations import NestIndex


def run_flags(doc_positions: dict[str, tuple[str, int]], run: Path) -> dict[str, dict]:
    """Per mode of the answers in ``run``: how many, the ids flagged ``before`` and ``after``,
    and what the answers cleared repeat."""
    flags: dict[str, dict] = {}
    for line in (run / "items.jsonl").read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        output = item["output"]
        mode = flags.setdefault(item["mode"], {"answers": 0, "before": [], "after": [], "cleared": {}})
        mode["answers"] += 1
        before = recopied_source(output, doc_positions) or repeated_ngram(output["text"])
        after = is_repetitive(output, doc_positions)
        mode["before"] += [item["item_id"]] if before else []
        mode["after"] += [item["item_id"]] if after else []
        if before and not after:
            mode["cleared"][item["item_id"]] = [" ".join(gram) for gram in islice(repeated_ngrams(output["text"]), 2)]
    return flags


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:RUN", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report: dict = {}
    rows = []
    for name, (index_path, run) in domain_specs(args.domain).items():
        report[name] = run_flags(doc_positions_of(NestIndex.load(index_path).passages), Path(run))
        for mode, flags in report[name].items():
            cleared = "; ".join(f"`{item}`" for item in flags["cleared"]) or "–"
            rows.append([name, mode, flags["answers"], len(flags["before"]), len(flags["after"]), cleared])
    header = ["run", "mode", "answers", "flagged before", "after", "cleared (they repeat only what their sources repeat)"]
    write_report(args.out, "repeats_beyond_sources", report, markdown_table(header, rows))


if __name__ == "__main__":
    main()
