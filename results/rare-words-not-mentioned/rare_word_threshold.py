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
        --domain fastify=task:markdown-docs:results/code-line-indentation/fastify-256 ...

A domain is ``NAME=SOURCE:RUN``: SOURCE an index folder, or ``task:markdown-docs``,
``task:markdown-docs-pino``, ``task:docs`` or ``task:people`` (the corpora ``nest eval`` builds for
those tasks); RUN a run folder (its ``items.jsonl``, ``nest`` mode). Writes
``rare_word_threshold.json`` and ``rare_word_threshold.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_integrations import NestIndex, load_wikipedia_summaries
from nest_integrations.policy import mentions
from nest_integrations.policy.conversation import question_asked_now

THRESHOLDS = (1.5, 2.0, 2.5, 3.0, 3.5)
ABSTENTION = "The documents do not cover"


def corpus(source: str) -> list:
    """The passages of an index folder or of a benchmark task's corpus."""
    if not source.startswith("task:"):
        return NestIndex.load(source).passages
    from nest_benchmarks.docs_corpus import docs_passages
    from nest_benchmarks.markdown_docs import markdown_passages

    task = source.removeprefix("task:")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", action="append", required=True, help="NAME=SOURCE:RUN")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = {}
    for spec in args.domain:
        name, _, rest = spec.partition("=")
        source, _, run = rest.rpartition(":")
        report[name] = counts(corpus(source), Path(run))
    (args.out / "rare_word_threshold.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = ["| set | " + " | ".join(f"Zipf < {t}" for t in THRESHOLDS) + " |", "|---|" + "---|" * len(THRESHOLDS)]
    for name, by_threshold in report.items():
        cells = [f"+{r['unanswerable']} / -{r['lost']} / {r['wrong']}" for r in by_threshold.values()]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    table = "\n".join(rows) + "\n"
    (args.out / "rare_word_threshold.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
