"""How rare must a word be to count as a name? The questions each threshold would turn away as
naming what the corpus never mentions (``policy.mentions``), over ``nest eval`` runs made before
rare words counted as names. No generation: the check reads the question and the corpus' words.

For each threshold of wordfreq's Zipf frequency (``mentions.RARE_WORD_ZIPF``) and each question
the run did not abstain on, the question is turned away when it names something (a capitalised
word, or a word rarer than the threshold) that no passage or title of the corpus holds. Counted:
unanswerable questions turned away (+), answers holding a gold string lost (-), and wrong answers
to answerable questions turned away.

    python results/rare-words-not-mentioned/rare_word_threshold.py --out results/rare-words-not-mentioned \\
        --domain attrs=IDX/attrs:results/code-line-indentation/attrs \\
        --domain fastify=@markdown-docs:results/code-line-indentation/fastify-256 ...

A domain is ``NAME=SOURCE:RUN``: SOURCE an index folder, or ``@markdown-docs``,
``@markdown-docs-pino``, ``@docs`` or ``@people`` (the corpora ``nest eval`` builds for those
tasks); RUN a run folder (its ``items.jsonl``, ``nest`` mode). Writes
``rare_word_threshold.json`` and ``rare_word_threshold.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_integrations import NestIndex, load_wikipedia_summaries
from nest_integrations.policy import mentions
from nest_integrations.policy.conversation import question_asked_now

THRESHOLDS = (1.5, 2.0, 2.5, 3.0, 3.5)
ABSTENTION = "The documents do not cover"


def corpus(source: str) -> list:
    """The passages of an index folder or of a benchmark task's corpus."""
    if not source.startswith("@"):
        return NestIndex.load(source).passages
    from nest_benchmarks.docs_corpus import docs_passages
    from nest_benchmarks.markdown_docs import markdown_passages

    task = source.removeprefix("@")
    return {
        "markdown-docs": lambda: markdown_passages(docs_set="fastify"),
        "markdown-docs-pino": lambda: markdown_passages(docs_set="pino"),
        "docs": docs_passages,
        "people": lambda: load_wikipedia_summaries(topic="People"),
    }[task]()


def counts(passages: list, run: Path) -> dict[str, dict]:
    """Per threshold: ``{"turned_away": [...], "unanswerable": n, "lost": n, "wrong": n}``."""
    terms = mentions.CorpusTerms(f"{p.title}\n{p.text}" for p in passages)
    items = [json.loads(line) for line in (run / "items.jsonl").open()]
    items = [item for item in items if item["mode"] == "nest" and not item["output"]["text"].startswith(ABSTENTION)]
    report = {}
    for threshold in THRESHOLDS:
        mentions.RARE_WORD_ZIPF = threshold
        row = {"turned_away": [], "unanswerable": 0, "lost": 0, "wrong": 0}
        for item in items:
            names = terms.unmentioned(question_asked_now(item["query"]))
            if not names:
                continue
            row["turned_away"].append({"id": item["item_id"], "names": names})
            if item["meta"].get("unanswerable"):
                row["unanswerable"] += 1
            elif any(answer in item["output"]["text"] for answer in item["meta"].get("answers", [])):
                row["lost"] += 1
            else:
                row["wrong"] += 1
        report[str(threshold)] = row
    return report


def table(report: dict) -> str:
    """The Markdown table of :func:`main`'s report: ``+unanswerable / -lost / wrong`` per threshold."""
    rows = [[name, *(f"+{r['unanswerable']} / -{r['lost']} / {r['wrong']}" for r in by_threshold.values())] for name, by_threshold in report.items()]
    return markdown_table(["set", *(f"Zipf < {t}" for t in THRESHOLDS)], rows)


def main() -> None:
    args = domain_parser(__doc__.split("\n\n")[0], "NAME=SOURCE:RUN").parse_args()
    report = {name: counts(corpus(source), Path(run)) for name, (source, run) in domain_specs(args.domain).items()}
    write_report(args.out, "rare_word_threshold", report, table(report))


if __name__ == "__main__":
    main()
