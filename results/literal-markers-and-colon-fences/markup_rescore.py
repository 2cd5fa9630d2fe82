"""Answers that copy markup, before and after a change, read by the markup check as it is now
(:func:`~nest_benchmarks.metrics.copied_markup`), from stored runs without generating.

The check counts more than it did when the earlier runs were scored (a paragraph's closing ``::``,
a colon fence's lines), so both runs are read again by the same check. Each run is read with the
passages it was generated over: an index's ``passages.jsonl``, or ``@docs`` / ``@docs-splitter``
(the docstrings' passages as ``nest eval --task docs`` cuts them).

    python results/literal-markers-and-colon-fences/markup_rescore.py --out results/literal-markers-and-colon-fences \\
        --domain borg=IDX/borg:IDX/borg:BEFORE/borg:AFTER/borg ...

A domain is ``NAME=BEFORE_PASSAGES:AFTER_PASSAGES:BEFORE_RUN:AFTER_RUN``. Writes ``markup_rescore.json``
and ``markup_rescore.md``: per domain, the answers with markup copied before and after, and the kinds.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from nest_benchmarks.metrics import copied_markup
from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, read_run_items, write_report
from nest_integrations.corpus.passages import parse_passages_jsonl


def passages_of(source: str) -> dict[str, str]:
    """``{passage id: text}`` of an index folder, or of the docstrings' passages (``@docs``, ``@docs-splitter``)."""
    if source.startswith("@docs"):
        from nest_benchmarks.runner import docs_domain_passages

        chunking = "splitter" if source == "@docs-splitter" else "cli"
        return {p.id: p.text for p in docs_domain_passages("docs", chunking)}
    path = Path(source) / "passages.jsonl"
    with path.open("rb") as lines:
        return {passage.id: passage.text for passage in parse_passages_jsonl(lines, str(path))}


def markup_in(run: Path, passages: dict[str, str]) -> dict[str, object]:
    """How many answers of ``run`` copy markup, the items that do, and the kinds copied."""
    found = {f"{item_id}/{mode}/{condition}": copied_markup(item["output"], passages) for (item_id, mode, condition), item in read_run_items(run).items()}
    flagged = sorted(name for name, kinds in found.items() if kinds)
    return {"answers": len(found), "with_markup": len(flagged), "items": flagged, "kinds": dict(Counter(k for kinds in found.values() for k in kinds))}


def main() -> None:
    parser = domain_parser(__doc__, "NAME=BEFORE_PASSAGES:AFTER_PASSAGES:BEFORE_RUN:AFTER_RUN")
    args = parser.parse_args()
    report = {}
    for name, fields in domain_specs(args.domain).items():
        if len(fields) != 4:
            parser.error(f"--domain {name}: expected NAME=BEFORE_PASSAGES:AFTER_PASSAGES:BEFORE_RUN:AFTER_RUN")
        before_passages, after_passages, before, after = fields
        report[name] = {"before": markup_in(Path(before), passages_of(before_passages)), "after": markup_in(Path(after), passages_of(after_passages))}
    rows = [
        (name, r["before"]["answers"], r["before"]["with_markup"], r["after"]["with_markup"], ", ".join(f"`{i}`" for i in r["after"]["items"]) or "–")
        for name, r in report.items()
    ]
    table = markdown_table(("domain", "answers", "with markup before", "after", "answers with markup after"), rows)
    write_report(args.out, "markup_rescore", report, table)


if __name__ == "__main__":
    main()
