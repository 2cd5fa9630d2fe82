"""Fit the answer selector's weights (nest_integrations.policy.selection) on question sets.

For every answerable question of every domain given, the first stage retrieves
``passage_k`` passages; every candidate answer window of them is a row of
``window_features`` labelled by whether the window, with the section title the decoder
copies before it, holds a gold answer. The weights are those of a conditional logit: the
softmax of the windows' scores within each question, fitted to put its mass on the windows
that hold the answer (the selector only ranks one question's windows against each other, and
a fit over all rows at once let the questions with many easy windows decide the ranking of the
rest); one more logistic regression over the scores scales them and sets the intercept, so that
the selector's output stays a probability that a window holds the answer. Each domain is also
scored by a model fitted on the *other* domains (leave-one-domain-out), the estimate of how the
fit carries to documentation it never saw. For the unanswerable questions it reports how well
the best window's probability tells them from the answerable ones (ROC AUC): whether the model
could also decide that nothing answers.

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

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table
from nest_benchmarks.selector_fit import abstention_auc, fit, selected_recall
from nest_benchmarks.window_rows import PASSAGE_K, domain_rows
from nest_integrations import NestIndex
from nest_integrations.policy.selection import FEATURES, AnswerSelector


def readme(report: dict) -> str:
    """The README of :func:`main`'s report: its table per domain, then the pooled fit's weights."""
    rows = [
        [name, d["answerable"], d["retrieved"], d["selected_left_out"], d["selected_pooled"], d["unanswerable"], d["abstention_auc"] if d["abstention_auc"] is not None else "-"]
        for name, d in report["domains"].items()
    ]
    header = ["domain", "answerable", "first stage holds it", "the chosen windows hold it (fit without the domain)", "(pooled fit)", "unanswerable", "best window tells them apart (AUC)"]
    return "# Answer selector fit\n\n" + markdown_table(header, rows) + f"\nweights {report['weights']}, bias {report['bias']}\n"


def main() -> None:
    args = domain_parser(__doc__, "NAME=INDEX:QA", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    domains = {name: domain_rows(NestIndex.load(index_path), qa) for name, (index_path, qa) in domain_specs(args.domain).items()}
    report: dict = {"features": list(FEATURES), "passage_k": PASSAGE_K, "domains": {}}
    for name, rows in domains.items():
        others = [r for other, rs in domains.items() if other != name for r in rs]
        selector = fit(others)
        report["domains"][name] = {
            "answerable": sum(not r["unanswerable"] for r in rows),
            "retrieved": sum(r["retrieved"] for r in rows),
            "selected_left_out": selected_recall(selector, rows),
        }
    pooled = [r for rs in domains.values() for r in rs]
    fitted = fit(pooled)
    selector = AnswerSelector(tuple(round(w, 4) for w in fitted.weights), round(fitted.bias, 4))
    report.update(weights=dict(zip(FEATURES, selector.weights)), bias=selector.bias)
    for name, rows in domains.items():
        report["domains"][name].update(
            selected_pooled=selected_recall(selector, rows),
            unanswerable=sum(r["unanswerable"] for r in rows),
            abstention_auc=abstention_auc(selector, rows),
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "selector.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "README.md").write_text(readme(report))
    print(readme(report))


if __name__ == "__main__":
    main()
