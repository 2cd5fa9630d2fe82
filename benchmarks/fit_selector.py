"""Fit the answer selector's weights (nest_integrations.policy.selection) on question sets.

For every answerable question of every domain given, the first stage retrieves
``passage_k`` passages; every candidate answer window of them is a row of
``window_features`` labelled by whether the window, with the section title the decoder
copies before it, holds a gold answer. A logistic regression over those rows gives the
weights; each domain is also scored by a model fitted on the *other* domains
(leave-one-domain-out), the estimate of how the fit carries to documentation it never
saw. For the unanswerable questions it reports how well the best window's probability
tells them from the answerable ones (ROC AUC): whether the model could also decide that
nothing answers.

    python benchmarks/fit_selector.py --out results/selector-fit \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl \\
        --domain fastify=IDX/fastify:markdown-docs ...

A domain is ``NAME=INDEX:QA`` where QA is a markdown-qa JSONL file or the name of a
bundled question task (markdown-docs, markdown-docs-pino, docs, wiki-qa-hard). Writes
``selector.json`` (weights, per-domain recall) and ``README.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from nest_benchmarks.window_rows import PASSAGE_K, domain_rows
from nest_integrations import NestIndex
from nest_integrations.policy.selection import FEATURES, AnswerSelector


def fit(rows: list[dict]) -> LogisticRegression:
    answerable = [r for r in rows if not r["unanswerable"] and len(r["labels"])]
    X = np.concatenate([r["features"] for r in answerable])
    y = np.concatenate([r["labels"] for r in answerable])
    return LogisticRegression(max_iter=5000, C=1.0).fit(X, y)


def selected_recall(selector: AnswerSelector, rows: list[dict], count: int = 2) -> int:
    """Answerable questions whose ``count`` chosen windows (as AnswerSelector.select chooses) hold the answer."""
    found = 0
    for r in rows:
        if r["unanswerable"] or not len(r["labels"]):
            continue
        order = np.argsort(-selector.probabilities(r["features"]), kind="stable")
        taken: list[tuple[str, int, int]] = []
        hit = False
        for i in order:
            c = r["candidates"][int(i)]
            here = (c.passage.doc_id or c.passage.id, c.passage.doc_char_start + c.start, c.passage.doc_char_start + c.end)
            if any(d == here[0] and s < here[2] and here[1] < e for d, s, e in taken):
                continue
            taken.append(here)
            hit = hit or bool(r["labels"][int(i)])
            if len(taken) == count:
                break
        found += hit
    return found


def best_probabilities(selector: AnswerSelector, rows: list[dict]) -> list[tuple[float, bool]]:
    return [(float(selector.probabilities(r["features"]).max()) if len(r["labels"]) else 0.0, r["unanswerable"]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domain", action="append", required=True, help="NAME=INDEX:QA")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    domains = {}
    for spec in args.domain:
        name, _, rest = spec.partition("=")
        index_path, _, qa = rest.partition(":")
        domains[name] = domain_rows(NestIndex.load(index_path), qa)
    report: dict = {"features": list(FEATURES), "passage_k": PASSAGE_K, "domains": {}}
    for name, rows in domains.items():
        others = [r for other, rs in domains.items() if other != name for r in rs]
        held = fit(others)
        selector = AnswerSelector(tuple(float(w) for w in held.coef_[0]), float(held.intercept_[0]))
        report["domains"][name] = {
            "answerable": sum(not r["unanswerable"] for r in rows),
            "retrieved": sum(r["retrieved"] for r in rows),
            "selected_left_out": selected_recall(selector, rows),
        }
    pooled = [r for rs in domains.values() for r in rs]
    model = fit(pooled)
    selector = AnswerSelector(tuple(round(float(w), 4) for w in model.coef_[0]), round(float(model.intercept_[0]), 4))
    report.update(weights=dict(zip(FEATURES, selector.weights)), bias=selector.bias)
    for name, rows in domains.items():
        best = best_probabilities(selector, rows)
        both = len({u for _, u in best}) == 2
        report["domains"][name].update(
            selected_pooled=selected_recall(selector, rows),
            unanswerable=sum(u for _, u in best),
            abstention_auc=round(float(roc_auc_score([not u for _, u in best], [p for p, _ in best])), 3) if both else None,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "selector.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "| domain | answerable | first stage holds it | chosen windows hold it (fit without the domain) | (pooled fit) | unanswerable | best window tells them apart (AUC) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, d in report["domains"].items():
        lines.append(
            f"| {name} | {d['answerable']} | {d['retrieved']} | {d['selected_left_out']} | {d['selected_pooled']} | "
            f"{d['unanswerable']} | {d['abstention_auc'] if d['abstention_auc'] is not None else '-'} |"
        )
    (args.out / "README.md").write_text("# Answer selector fit\n\n" + "\n".join(lines) + f"\n\nweights {report['weights']}, bias {report['bias']}\n")
    print((args.out / "README.md").read_text())


if __name__ == "__main__":
    main()
