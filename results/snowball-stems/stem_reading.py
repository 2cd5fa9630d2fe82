"""The light stemmer of the release before against the Snowball stemmer, without generating: what
the gate keeps and which windows the selector chooses, for every question of each set, read with
each stemmer (``policy.words.stem``: the gate's coverage of the question's words, the named-words
check, the selector's word overlap and coverage features). The selector's weights are the
library's (``DEFAULT_SELECTOR``); the names check over the whole corpus (``policy.mentions``) is
not run: it read words with a Snowball stemmer before too (NLTK's, which differs from
``snowballstemmer`` on 15 of the documentation sets' 6,709 words: "adding" -> "ad", not "add").

    python results/snowball-stems/stem_reading.py --out results/snowball-stems \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl \\
        --domain fastify=IDX/fastify:markdown-docs ...

A domain is ``NAME=INDEX:QA`` as in ``benchmarks/fit_selector.py``. Counted per stemmer: the
answerable questions the gate keeps no passage for, the unanswerable ones it keeps a passage
for, and the answerable ones whose chosen windows hold the answer, among those it keeps a
passage for (the selector's three windows, as ``fit_selector.py`` counts them). Writes
``stem_reading.json`` and ``stem_reading.md``.
"""

from __future__ import annotations

from typing import Callable

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.selector_fit import selected_recall
from nest_benchmarks.window_rows import domain_rows
from nest_integrations import NestIndex
from nest_integrations.policy import relevance, selection, words
from nest_integrations.policy.selection import DEFAULT_SELECTOR


def light_stem(word: str) -> str:
    """The release before's stemmer, the baseline measured here: a few English suffixes cut
    ("slicings" -> "slic", "indentation" -> "indent"), then a final "e" after four letters."""
    for suffix in ("ations", "ation", "ments", "ment", "ings", "ing", "ies", "es", "ed", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    return word[:-1] if len(word) > 4 and word.endswith("e") else word


STEMMERS: dict[str, Callable[[str], str]] = {"light": light_stem, "snowball": words.stem}


def read_with(stemmer: Callable[[str], str], index: NestIndex, qa: str) -> dict:
    """The counts of the module docstring for one set, its words stemmed by ``stemmer``."""
    relevance.stem = selection.stem = stemmer  # the two modules that read words through it
    try:
        rows = domain_rows(index, qa)
        gate = relevance.RelevanceGate()
        kept = [bool(gate.decide(r["query"], r["passages"], index.relevance).kept) for r in rows]
    finally:
        relevance.stem = selection.stem = words.stem
    answerable = [k for r, k in zip(rows, kept) if not r["unanswerable"]]
    return {
        "answerable": len(answerable),
        "unanswerable": len(rows) - len(answerable),
        "gate_keeps_none": answerable.count(False),
        "gate_keeps_unanswerable": sum(k for r, k in zip(rows, kept) if r["unanswerable"]),
        "windows_hold_it": selected_recall(DEFAULT_SELECTOR, [r for r, k in zip(rows, kept) if k]),
    }


def table(report: dict) -> str:
    header = ["set", "answerable (unanswerable)"] + [
        f"{name}: {what}" for name in STEMMERS for what in ("gate keeps none", "gate keeps an unanswerable", "windows hold it")
    ]
    rows = [
        [name, f"{d['light']['answerable']} ({d['light']['unanswerable']})"]
        + [d[s][key] for s in STEMMERS for key in ("gate_keeps_none", "gate_keeps_unanswerable", "windows_hold_it")]
        for name, d in report.items()
    ]
    return markdown_table(header, rows)


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:QA").parse_args()
    report = {}
    for name, (index_path, qa) in domain_specs(args.domain).items():
        index = NestIndex.load(index_path)
        report[name] = {stemmer: read_with(fn, index, qa) for stemmer, fn in STEMMERS.items()}
    write_report(args.out, "stem_reading", report, table(report))


if __name__ == "__main__":
    main()
