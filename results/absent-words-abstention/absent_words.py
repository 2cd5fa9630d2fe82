"""Would "the question's meaning rests on words its corpus never holds" tell the questions the
documents do not answer? Measured on finished ``nest eval`` runs, beside the abstention they made.

For each question (the whole conversation, one question a line), the content words
(``content_words``: stems, without stopwords) that no passage of the index holds are taken out of
it, and the embedder (the default, all-MiniLM-L6-v2) gives the cosine of the question to what is
left: 1 when nothing is missing, low when the missing words carry its meaning ("How do I convert a
pydantic model into an equivalent marshmallow schema?" over documentation that never says
"pydantic"). A rule would abstain below a threshold. Reported per set: the ROC AUC of 1 - cosine
for the unanswerable questions, and at each threshold the unanswerable questions it would add to
those the run abstained on, the answers holding a gold string it would take away, and the wrong
answers it would turn into an abstention.

    python results/absent-words-abstention/absent_words.py --out results/absent-words-abstention \\
        --domain attrs=IDX/attrs:results/announced-code-and-cut-white-space/attrs ...

A domain is ``NAME=INDEX:RUN`` (an index folder and a ``nest eval`` run folder of it, ``nest`` mode).
Writes ``absent_words.json`` (per question) and ``absent_words.md`` (the Markdown table).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_integrations import NestIndex
from nest_integrations.policy.relevance import content_words, text_stems
from nest_integrations.retrieval.dense import load_embedder

THRESHOLDS = (0.7, 0.75, 0.78, 0.8, 0.82, 0.85)
ABSTENTION = "The documents do not cover"


def corpus_stems(index_path: str) -> set[str]:
    """Stems of every word of every passage of the index."""
    stems: set[str] = set()
    for passage in NestIndex.load(index_path).passages:
        stems |= text_stems(passage.text)
    return stems


def question_rows(embedder, stems: set[str], run: Path) -> list[dict]:
    """Per ``nest`` item of ``run``: unanswerable or not, the missing stems, the cosine, abstained, right."""
    rows = []
    for line in (run / "items.jsonl").open():
        item = json.loads(line)
        if item["mode"] != "nest":
            continue
        question = item["query"]
        missing = content_words(question) - stems
        kept = [word for word in question.split() if not (content_words(word) and content_words(word) <= missing)]
        vectors = np.asarray(embedder.encode([question, " ".join(kept)]), dtype=np.float64)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        text = item["output"]["text"]
        rows.append({
            "id": item["item_id"],
            "unanswerable": bool(item["meta"].get("unanswerable", False)),
            "missing": sorted(missing),
            "cosine": float(vectors[0] @ vectors[1]),
            "abstained": text.startswith(ABSTENTION),
            "right": any(answer in text for answer in item["meta"].get("answers", [])),
        })
    return rows


def at_threshold(rows: list[dict], threshold: float) -> tuple[int, int, int]:
    """(unanswerable questions added to the run's abstentions, right answers lost, wrong answers abstained)."""
    below = [r for r in rows if r["cosine"] < threshold and not r["abstained"]]
    return (
        sum(r["unanswerable"] for r in below),
        sum(not r["unanswerable"] and r["right"] for r in below),
        sum(not r["unanswerable"] and not r["right"] for r in below),
    )


def table(results: dict) -> str:
    """The Markdown table of :func:`main`'s results."""
    rows = []
    for name, rows_of_set in results.items():
        flags = np.array([r["unanswerable"] for r in rows_of_set])
        auc = round(float(roc_auc_score(flags, [1 - r["cosine"] for r in rows_of_set])), 2) if flags.any() and not flags.all() else "–"
        abstained = sum(r["unanswerable"] and r["abstained"] for r in rows_of_set)
        rows.append([name, f"{int(flags.sum())} ({abstained})", auc, *("+{} / -{} / {}".format(*at_threshold(rows_of_set, t)) for t in THRESHOLDS)])
    return markdown_table(["set", "unanswerable (run abstained)", "AUC", *(f"< {t}: +abstained / -right / wrong abstained" for t in THRESHOLDS)], rows)


def main() -> None:
    args = domain_parser(__doc__.split("\n\n")[0], "NAME=INDEX:RUN").parse_args()
    embedder = load_embedder()
    results = {name: question_rows(embedder, corpus_stems(index_path), Path(run)) for name, (index_path, run) in domain_specs(args.domain).items()}
    write_report(args.out, "absent_words", results, table(results))


if __name__ == "__main__":
    main()
