"""What the relevance gate keeps as its coverage floor varies, on one question set (no generation).

    python benchmarks/gate_coverage.py NAME INDEX QA

QA is a markdown-qa JSONL file or the name of a bundled question task (markdown-docs,
markdown-docs-pino, docs, wiki-qa-hard). For each floor it prints how many answerable questions
whose answer the first stage found keep a passage (the rest are answered with an abstention) and
how many unanswerable ones keep one (and may be answered from unrelated text). The figures in
results/selector-fit/coverage.md come from it.
"""

import sys

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.runner import load_items
from nest_benchmarks.tasks import TASKS
from nest_integrations import NestIndex
from nest_integrations.policy.relevance import RelevanceGate, passage_similarities

FLOORS = (0.5, 0.34, 0.25, 0.0)
PASSAGE_K = 8


def main() -> None:
    name, path, qa = sys.argv[1:4]
    index = NestIndex.load(path)
    task, qa_path = (qa, None) if qa in TASKS else ("markdown-qa", qa)
    rows = []
    for item in load_items(task, None, passages=index.passages, qa_path=qa_path):
        hits = [p for p, _ in index.retrieve(item.query, PASSAGE_K)]
        rows.append((item, hits, passage_similarities(item.query, hits, index.relevance)))
    for floor in FLOORS:
        gate = RelevanceGate(min_coverage=floor)
        answerable = kept_answerable = unanswerable = kept_unanswerable = 0
        for item, hits, similarities in rows:
            kept = bool(gate(item.query, hits, similarities).kept)
            if item.meta.get("unanswerable"):
                unanswerable += 1
                kept_unanswerable += kept
            elif any(answer_recall(p.text, item.meta["answers"]) for p in hits):
                answerable += 1
                kept_answerable += kept
        print(f"| {name} | {floor} | {kept_answerable} of {answerable} | {kept_unanswerable} of {unanswerable} |")


if __name__ == "__main__":
    main()
