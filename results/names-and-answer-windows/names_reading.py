"""The gate's names rule held to the answer windows too, measured without generating: for every
question the gate keeps a passage for, the selector's three windows chosen among every retrieved
passage (the release before's choice) against those chosen among the passages that mention each
multi-word name the question gives (``relevance.query_names``: "William Blake", "Backblaze B2"),
the rule the gate applies to the passages it keeps, or any of them when no passage mentions all
(``relevance.naming_passages``, the decoder's choice).

    python results/names-and-answer-windows/names_reading.py --out results/names-and-answer-windows \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

A domain is ``NAME=INDEX:QA`` as in ``benchmarks/fit_selector.py``. Dropping a passage's windows
from the ranked candidates changes no other window's features (its passage's rank, its overlap
against the best), so the windows chosen among the named passages are those the selector would
choose skipping the others. Counted per choice: answerable questions whose three windows hold the
answer (as ``fit_selector.py`` counts them), questions with a window from a passage that never
mentions a name the question gives, and questions no retrieved passage mentions every name of
(where the decoder falls back to any name). Writes ``names_reading.json`` and ``names_reading.md``.
"""

from __future__ import annotations

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.selector_fit import selected_recall
from nest_benchmarks.window_rows import domain_rows
from nest_integrations import NestIndex
from nest_integrations.core.similarity import Relevance
from nest_integrations.policy.relevance import RelevanceGate, mentions_query_names, naming_passages, query_names
from nest_integrations.policy.selection import DEFAULT_SELECTOR


def named_only(row: dict) -> dict:
    """``row`` with only the candidate windows the decoder chooses among: those of the passages
    that mention the question's names (``relevance.naming_passages``)."""
    named = {p.id for p in naming_passages(row["query"], row["passages"])}
    keep = [i for i, c in enumerate(row["candidates"]) if c.passage.id in named]
    return {**row, "features": row["features"][keep], "labels": row["labels"][keep], "candidates": [row["candidates"][i] for i in keep]}


def unnamed_windows(row: dict, relevance: Relevance) -> bool:
    """Whether the selector's three windows of ``row`` include one from a passage that never
    mentions a name the question gives."""
    windows = DEFAULT_SELECTOR.select(row["query"], row["passages"], relevance, count=3)
    by_id = {p.id: p for p in row["passages"]}
    return any(not mentions_query_names(row["query"], by_id[w.passage_id].text) for w in windows)


def read(index: NestIndex, qa: str) -> dict:
    """The counts of the module docstring for one set."""
    gate = RelevanceGate()
    rows = [r for r in domain_rows(index, qa) if gate.decide(r["query"], r["passages"], index.relevance).kept]
    named = [r for r in rows if query_names(r["query"])]
    return {
        "gate_keeps_a_passage": len(rows),
        "questions_giving_a_name": len(named),
        "windows_hold_it": {"every_retrieved": selected_recall(DEFAULT_SELECTOR, rows), "named_only": selected_recall(DEFAULT_SELECTOR, [named_only(r) for r in rows])},
        "a_window_never_names_them": sum(unnamed_windows(r, index.relevance) for r in named),
        "no_passage_names_them_all": sum(not any(mentions_query_names(r["query"], p.text) for p in r["passages"]) for r in named),
    }


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:QA").parse_args()
    report = {name: read(NestIndex.load(index_path), qa) for name, (index_path, qa) in domain_specs(args.domain).items()}
    header = ["set", "the gate keeps a passage", "... giving a multi-word name", "windows hold it: every retrieved passage",
              "windows hold it: named passages only", "a window from a passage that never names them",
              "no passage names them all"]
    rows = [[name, r["gate_keeps_a_passage"], r["questions_giving_a_name"], r["windows_hold_it"]["every_retrieved"],
             r["windows_hold_it"]["named_only"], r["a_window_never_names_them"], r["no_passage_names_them_all"]] for name, r in report.items()]
    write_report(args.out, "names_reading", report, markdown_table(header, rows))


if __name__ == "__main__":
    main()
