"""Which questions the gate decides otherwise now that a run of acronyms ("an SSH URL", "the LFS
API") is not one name a passage must mention whole (``words.is_acronym_run``), without generating.

For every question of every set given, the first stage retrieves ``passage_k`` passages and the
gate (default settings) decides which it keeps. Where the question holds a run of acronyms, the
gate of the release before is read too: it kept only the passages that also mention every word
of each such run (``relevance.mentions``), as it did for any run of capitalised words.

    python results/acronym-runs-not-names/acronym_runs.py --out results/acronym-runs-not-names \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

A domain is ``NAME=INDEX:QA`` (a markdown-qa JSONL file or a bundled task's name; the bio and
wiki-qa tasks take their first 24 items). Writes ``acronym_runs.json`` and prints each change.
"""

from __future__ import annotations

import argparse
import json
import re

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.report_files import domain_parser, domain_specs
from nest_benchmarks.runner import set_items
from nest_benchmarks.window_rows import PASSAGE_K
from nest_integrations import NestIndex
from nest_integrations.core.config import NestConfig
from nest_integrations.policy.relevance import RelevanceGate, mentions

ACRONYM_RUN = re.compile(r"(?<=\s)[A-Z]{2,}(?:\s+[A-Z]{2,})+\b")
"""Two or more upper-case words one space apart after a question's first word: what the names
rule of the release before read as one name."""


def holds_answer(passages: list, answers: list[str]) -> bool:
    """Whether one of ``passages`` holds a gold answer (never, for a question without one)."""
    return bool(answers) and any(answer_recall(p.text, answers) for p in passages)


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:QA", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    gate = RelevanceGate.from_config(NestConfig())
    report: dict = {"questions": 0, "with_acronym_runs": 0, "changed": []}
    for name, (index_path, qa) in domain_specs(args.domain).items():
        index = NestIndex.load(index_path)
        for item in set_items(qa, index.passages):
            report["questions"] += 1
            runs = ACRONYM_RUN.findall(item.query)
            if not runs:
                continue
            report["with_acronym_runs"] += 1
            passages = [p for p, _ in index.retrieve(item.query, PASSAGE_K)]
            kept = gate.decide(item.query, passages, index.relevance).kept
            kept_before = [p for p in kept if all(mentions(run, p.text) for run in runs)]
            answers = item.meta.get("answers") or []
            change = {"set": name, "id": item.id, "unanswerable": bool(item.meta.get("unanswerable")), "question": item.query, "runs": runs,
                      "kept_before": [p.id for p in kept_before], "kept_after": [p.id for p in kept],
                      "answer_kept_before": holds_answer(kept_before, answers), "answer_kept_after": holds_answer(kept, answers)}
            if change["kept_before"] != change["kept_after"]:
                report["changed"].append(change)
                print(json.dumps(change))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "acronym_runs.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['questions']} questions, {report['with_acronym_runs']} with a run of acronyms, {len(report['changed'])} decided otherwise")


if __name__ == "__main__":
    main()
