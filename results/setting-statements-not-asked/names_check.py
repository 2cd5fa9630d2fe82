"""Which questions the names checks decide otherwise when they read the sentences that ask
(``conversation.asked_sentences``) instead of the whole question asked now, without generating.

For every question of every set given, the first stage retrieves ``passage_k`` passages; the
names checks (the corpus-wide one, ``CorpusTerms.unmentioned``, and the gate's,
``unmentioned_names`` and ``unmentioned_identifiers`` over the retrieved passages) are read over
the question asked now and over its asking sentences. For each question where they disagree, the
rest of the gate (``RelevanceGate.passes``, default settings) says how many passages it would keep.
Where both readings turn a question away, the names an abstention lists are compared too (its
"They never mention ..." line).

    python results/setting-statements-not-asked/names_check.py --out results/setting-statements-not-asked \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

A domain is ``NAME=INDEX:QA`` (a markdown-qa JSONL file or a bundled task's name; the bio and
wiki-qa tasks take their first 24 items). Writes ``names_check.json`` and prints each change.
"""

from __future__ import annotations

import argparse
import json

from nest_benchmarks.report_files import domain_parser, domain_specs
from nest_benchmarks.runner import set_items
from nest_benchmarks.window_rows import PASSAGE_K
from nest_integrations import NestIndex
from nest_integrations.core.config import NestConfig
from nest_integrations.policy.conversation import asked_sentences, question_asked_now
from nest_integrations.policy.relevance import RelevanceGate, passage_similarities, unmentioned_identifiers, unmentioned_names


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:QA", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    gate = RelevanceGate.from_config(NestConfig())
    report: dict = {"questions": 0, "changed": [], "listed_names_changed": []}
    for name, (index_path, qa) in domain_specs(args.domain).items():
        index = NestIndex.load(index_path)
        terms = index.corpus_terms
        for item in set_items(qa, index.passages):
            report["questions"] += 1
            passages = [p for p, _ in index.retrieve(item.query, PASSAGE_K)]
            readings = [question_asked_now(item.query), asked_sentences(item.query)]
            fires = [bool(terms.unmentioned(r) or unmentioned_names(r, passages) or unmentioned_identifiers(r, passages)) for r in readings]
            if fires[0] != fires[1]:
                similarities = passage_similarities(item.query, passages, index.relevance)
                kept = sum(gate.passes(item.query, p, s, max(similarities)) for p, s in zip(passages, similarities))
                change = {"set": name, "id": item.id, "unanswerable": bool(item.meta.get("unanswerable")), "question": readings[0],
                          "turned_away_before": fires[0], "turned_away_after": fires[1], "gate_keeps_after": kept}
                report["changed"].append(change)
                print(json.dumps(change))
            elif fires[0] and terms.unmentioned(readings[0]) != terms.unmentioned(readings[1]):
                report["listed_names_changed"].append({"set": name, "id": item.id, "question": readings[0]})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "names_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['questions']} questions, {len(report['changed'])} decided otherwise, "
          f"{len(report['listed_names_changed'])} listing other names")


if __name__ == "__main__":
    main()
