"""The first stage with BM25's words stemmed or not: for each set, the answerable questions whose
first 8 passages (the default hybrid retriever: dense and BM25 fused) hold a gold answer, and
those whose first passage does. No generation.

    python results/bm25-stems/bm25_stems.py --out results/bm25-stems \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

A domain is ``NAME=INDEX:QA`` as in ``benchmarks/fit_selector.py``. "snowball": BM25's index and
queries read through ``policy.words.stem`` (the stemmer of the relevance rules and the selector);
"none": as written (the library's BM25). Writes ``bm25_stems.json`` and ``bm25_stems.md``.
"""

from __future__ import annotations

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.runner import set_items
from nest_integrations import NestIndex
from nest_integrations.retrieval import bm25
from nest_integrations.policy.words import stem

K = 8


def snowball_tokens(texts: list[str], *, allow_empty: bool) -> list[list[str]]:
    """BM25's tokens with each word stemmed as the relevance rules stem it."""
    import bm25s

    return bm25s.tokenize(
        texts, lower=True, stopwords="en", stemmer=lambda words: [stem(w) for w in words], return_ids=False,
        show_progress=False, allow_empty=allow_empty,
    )


def first_stage(index_path: str, qa: str) -> dict:
    """Answerable questions, and those whose first ``K`` passages / first passage hold an answer."""
    index = NestIndex.load(index_path)
    counts = {"answerable": 0, f"recall@{K}": 0, "top_1": 0}
    for item in set_items(qa, index.passages, limits={}):
        answers = item.meta.get("answers") or []
        if item.meta.get("unanswerable") or not answers:
            continue
        hits = [p for p, _ in index.retrieve(item.query, K)]
        counts["answerable"] += 1
        counts[f"recall@{K}"] += any(answer_recall(p.text, answers) for p in hits)
        counts["top_1"] += bool(hits) and bool(answer_recall(hits[0].text, answers))
    return counts


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:QA").parse_args()
    report: dict[str, dict] = {}
    as_written = bm25._tokenize
    for name, (index_path, qa) in domain_specs(args.domain).items():
        report[name] = {"none": first_stage(index_path, qa)}
        bm25._tokenize = snowball_tokens
        try:
            report[name]["snowball"] = first_stage(index_path, qa)
        finally:
            bm25._tokenize = as_written
    header = ["set", "answerable"] + [f"{stems}: {what}" for stems in ("none", "snowball") for what in (f"recall@{K}", "top 1")]
    rows = [[name, r["none"]["answerable"]] + [r[s][key] for s in ("none", "snowball") for key in (f"recall@{K}", "top_1")] for name, r in report.items()]
    write_report(args.out, "bm25_stems", report, markdown_table(header, rows))


if __name__ == "__main__":
    main()
