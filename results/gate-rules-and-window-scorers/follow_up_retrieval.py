"""How a follow-up's passages are retrieved: the conversation's questions together, or with the last alone.

A follow-up's retrieval query holds the questions before it (``policy.conversation.retrieval_query``),
and the first of them often decides what the first stage finds: "How do I make instances of my
class immutable? / Then how do I get a copy with just one value changed?" retrieves the
immutability section, not ``evolve``. For every answerable follow-up of a set, the first stage's 8
passages are taken four ways: for the whole query (what NEST does), for the last question alone,
the two rankings fused by reciprocal rank (``1 / (60 + rank)`` summed), and the two interleaved
(best of each in turn, a passage once). Counted: the 8 passages hold a gold answer, and the three
windows the selector chooses among them (``AnswerSelector.select``) hold one.

    python results/gate-rules-and-window-scorers/follow_up_retrieval.py \\
        --out results/gate-rules-and-window-scorers --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

Writes ``follow_up_retrieval.json`` and ``follow_up_retrieval.md``.
"""

from __future__ import annotations

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.runner import load_items
from nest_benchmarks.tasks import TASKS
from nest_integrations import NestIndex
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.conversation import question_asked_now
from nest_integrations.policy.selection import DEFAULT_SELECTOR

PASSAGES = 8
RRF_OFFSET = 60
"""The usual constant of reciprocal rank fusion: ranks far down either list still count a little."""


def fused(rankings: list[list[Passage]]) -> list[Passage]:
    """The passages of ``rankings`` (each best first) by their summed ``1 / (RRF_OFFSET + rank)``."""
    score: dict[str, float] = {}
    by_id: dict[str, Passage] = {}
    for ranking in rankings:
        for rank, passage in enumerate(ranking):
            score[passage.id] = score.get(passage.id, 0.0) + 1.0 / (RRF_OFFSET + rank)
            by_id[passage.id] = passage
    return [by_id[i] for i in sorted(score, key=lambda i: -score[i])][:PASSAGES]


def interleaved(rankings: list[list[Passage]]) -> list[Passage]:
    """The best of each ranking in turn, each passage once, until ``PASSAGES``."""
    out: list[Passage] = []
    for rank in range(max(map(len, rankings))):
        for ranking in rankings:
            if rank < len(ranking) and all(p.id != ranking[rank].id for p in out):
                out.append(ranking[rank])
    return out[:PASSAGES]


def domain_counts(index: NestIndex, qa: str) -> dict:
    """Per way of retrieving: follow-ups whose passages, and whose selector's three windows, hold the answer."""
    task, path = (qa, None) if qa in TASKS else ("markdown-qa", qa)
    counts = {way: {"passages": 0, "windows": 0} for way in ("whole query", "last question", "fused", "interleaved")}
    follow_ups = 0
    for item in load_items(task, None, passages=index.passages, qa_path=path):
        if item.meta.get("unanswerable") or "\n" not in item.query.strip():
            continue
        follow_ups += 1
        # The hybrid retriever fuses at least 100 candidates of each list, so the first 8 of its
        # 16 are its 8: what NEST retrieves.
        whole, last = ([p for p, _ in index.retrieve(query, 2 * PASSAGES)] for query in (item.query, question_asked_now(item.query)))
        ways = {"whole query": whole[:PASSAGES], "last question": last[:PASSAGES], "fused": fused([whole, last]), "interleaved": interleaved([whole, last])}
        for way, passages in ways.items():
            by_id = {p.id: p for p in passages}
            windows = DEFAULT_SELECTOR.select(item.query, passages, index.relevance, count=3)
            counts[way]["passages"] += any(answer_recall(p.text, item.meta["answers"]) for p in passages)
            counts[way]["windows"] += any(answer_recall(by_id[w.passage_id].text[w.start : w.end], item.meta["answers"]) for w in windows)
    return {"follow_ups": follow_ups, "ways": counts}


def table(report: dict) -> str:
    """The Markdown table of :func:`main`'s report."""
    ways = list(next(iter(report.values()))["ways"])
    rows = [[name, r["follow_ups"], *(f"{r['ways'][w]['passages']} / {r['ways'][w]['windows']}" for w in ways)] for name, r in report.items()]
    return markdown_table(["set", "follow-ups", *ways], rows)


def main() -> None:
    args = domain_parser(__doc__.split("\n\n")[0], "NAME=INDEX:QA").parse_args()
    report = {}
    for name, (path, qa) in domain_specs(args.domain).items():
        report[name] = domain_counts(NestIndex.load(path), qa)
        print(name, report[name], flush=True)
    write_report(args.out, "follow_up_retrieval", report, table(report))


if __name__ == "__main__":
    main()
