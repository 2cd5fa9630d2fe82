"""Which questions the names checks turn away for an acronym the documents never write, without
generating: whether the acronyms a question names ("a PR comment", "an SVG badge", "with TLS")
tell answerable questions from those the documents do not answer.

For every question of every set given, the names of the sentences that ask
(``conversation.asked_sentences``, ``mentions.question_names``) that are acronyms (two or more
capitals or digits, a plural ``s`` allowed) are listed with the names the corpus never mentions
(``CorpusTerms.unmentioned``) and those no retrieved passage mentions
(``relevance.unmentioned_names``). A question turned away for acronyms alone would be kept if
acronyms were not names; every other question is decided as it is now.

    python results/acronyms-never-mentioned/acronyms_never_mentioned.py --out results/acronyms-never-mentioned \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

A domain is ``NAME=INDEX:QA`` (a markdown-qa JSONL file or a bundled task's name; the bio and
wiki-qa tasks take their first 24 items). Writes ``acronyms_never_mentioned.json`` and prints
each question that names an acronym the documents never write.
"""

from __future__ import annotations

import argparse
import json
import re

from nest_benchmarks.report_files import domain_parser, domain_specs
from nest_benchmarks.runner import set_items
from nest_benchmarks.window_rows import PASSAGE_K
from nest_integrations import NestIndex
from nest_integrations.policy.conversation import asked_sentences
from nest_integrations.policy.mentions import question_names
from nest_integrations.policy.relevance import unmentioned_identifiers, unmentioned_names

ACRONYM = re.compile(r"^[A-Z0-9]*[A-Z][A-Z0-9]+s?$")
"""A name that is an acronym: ``PR``, ``SVG``, ``TLS``, ``HTTP2``, ``CPUs``."""


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:QA", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report: dict = {"questions": 0, "naming_an_acronym": 0, "acronym_never_mentioned": []}
    for name, (index_path, qa) in domain_specs(args.domain).items():
        index = NestIndex.load(index_path)
        for item in set_items(qa, index.passages):
            report["questions"] += 1
            asked = asked_sentences(item.query)
            acronyms = [n for n in question_names(asked) if ACRONYM.match(n)]
            if not acronyms:
                continue
            report["naming_an_acronym"] += 1
            passages = [p for p, _ in index.retrieve(item.query, PASSAGE_K)]
            corpus = index.corpus_terms.unmentioned(asked)
            retrieved = unmentioned_names(asked, passages) + unmentioned_identifiers(asked, passages)
            never = [n for n in acronyms if n in corpus or n in retrieved]
            if not never:
                continue
            row = {
                "set": name, "id": item.id, "unanswerable": bool(item.meta.get("unanswerable")), "question": item.query,
                "acronyms_never_mentioned": never, "corpus_never_mentions": corpus, "retrieved_never_mention": retrieved,
                "turned_away_for_acronyms_alone": all(ACRONYM.match(n) for n in corpus + retrieved),
            }
            report["acronym_never_mentioned"].append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "acronyms_never_mentioned.json").write_text(json.dumps(report, indent=2) + "\n")
    rows = report["acronym_never_mentioned"]
    alone = [r for r in rows if r["turned_away_for_acronyms_alone"]]
    print(f"{report['questions']} questions, {report['naming_an_acronym']} name an acronym, {len(rows)} one the documents never write; "
          f"turned away for acronyms alone: {sum(not r['unanswerable'] for r in alone)} answerable, {sum(r['unanswerable'] for r in alone)} not")


if __name__ == "__main__":
    main()
