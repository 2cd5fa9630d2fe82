"""A fitted model of "nothing here answers": the signals measured one at a time, together.

One row a question: the selector's best window probability and the best window's cosine,
passage cosine, word coverage and section-title coverage (``policy.selection.window_features``),
and the embedder's cosine of the question to itself without the words its corpus never holds
(``results/absent-words-abstention/absent_words.json``, with whether that release's run abstained
and whether its answer held a gold string). A logistic regression (classes balanced) over a set of
these columns is fitted on the design sets but one and scored on that one (leave-one-domain-out;
the held-out sets by the fit over all design sets): the ROC AUC of answerable against
unanswerable, and what a threshold would do. The threshold is set on the training sets, at the
probability under which a share ``q`` of their right answers fall; on the scored set it counts the
unanswerable questions the run answered that it would turn into the plain abstention (``+``) and
the right answers it would take away (``-``).

    python results/gate-rules-and-window-scorers/abstention_model.py \\
        --out results/gate-rules-and-window-scorers --cache ROWS_DIR \\
        --absent-words results/absent-words-abstention/absent_words.json \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ... --held-out restic=... 

``--cache``: the rows ``window_scorers.py`` cached (computed here when absent). Writes
``abstention_model.json`` and ``abstention_model.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.window_rows import cached_domain_rows
from nest_integrations.policy.selection import DEFAULT_SELECTOR, FEATURES

SIGNALS = ("best probability", "cosine", "passage cosine", "coverage", "title coverage", "absent-word cosine")
COMBINATIONS: dict[str, tuple[str, ...]] = {
    "absent-word cosine": ("absent-word cosine",),
    "best probability + absent-word cosine": ("best probability", "absent-word cosine"),
    "cosine + coverage + absent-word cosine": ("cosine", "coverage", "absent-word cosine"),
    "all six": SIGNALS,
}
SHARES = (0.02, 0.05, 0.1)
"""Shares of the training sets' right answers a threshold may take away."""


def question_signals(row: dict, absent: dict) -> list[float]:
    """The :data:`SIGNALS` of one question (0 where no window was retrieved)."""
    features = row["features"]
    if not len(features):
        return [0.0] * (len(SIGNALS) - 1) + [absent["cosine"]]
    best = [features[:, FEATURES.index(name)].max() for name in ("cosine", "passage_cosine", "coverage", "title_coverage")]
    return [float(DEFAULT_SELECTOR.probabilities(features).max()), *map(float, best), absent["cosine"]]


def table(report: dict) -> str:
    """The Markdown table of :func:`main`'s report: per combination of signals, the AUC and the
    trade at each share."""
    names = list(next(iter(report.values())))
    rows = []
    for combination, by_set in report.items():
        rows.append([combination, "AUC", *("–" if by_set[n]["auc"] is None else by_set[n]["auc"] for n in names)])
        for share in SHARES:
            trades = [by_set[n]["trade"][str(share)] for n in names]
            rows.append(["", f"threshold at {share:.0%}", *(f"+{t['abstains_more']} / -{t['right_lost']}" for t in trades)])
    return markdown_table(["signals", "measure", *names], rows)


def main() -> None:
    parser = domain_parser(__doc__.split("\n\n")[0], "NAME=INDEX:QA, a design set")
    parser.add_argument("--held-out", action="append", default=[], help="NAME=INDEX:QA")
    parser.add_argument("--absent-words", type=Path, required=True)
    parser.add_argument("--cache", type=Path)
    args = parser.parse_args()
    absent_words = json.loads(args.absent_words.read_text())
    design = domain_specs(args.domain)
    held_out = domain_specs(args.held_out)
    data = {}
    for name, (path, qa) in {**design, **held_out}.items():
        by_id = {a["id"]: a for a in absent_words[name]}
        rows = [r for r in cached_domain_rows(path, qa, args.cache / f"{name}.pkl" if args.cache else None) if r["id"] in by_id]
        data[name] = (np.array([question_signals(r, by_id[r["id"]]) for r in rows]), [by_id[r["id"]] for r in rows])
    report: dict = {}
    for combination, signals in COMBINATIONS.items():
        columns = [SIGNALS.index(s) for s in signals]
        report[combination] = {}
        for name, (x, absent) in data.items():
            training = [d for d in design if d != name]
            model = LogisticRegression(max_iter=5000, class_weight="balanced").fit(
                np.vstack([data[d][0][:, columns] for d in training]),
                np.concatenate([[not a["unanswerable"] for a in data[d][1]] for d in training]),
            )
            answerable = np.array([not a["unanswerable"] for a in absent])
            p = model.predict_proba(x[:, columns])[:, 1]
            right_in_training = np.concatenate([model.predict_proba(data[d][0][:, columns])[:, 1][[a["right"] for a in data[d][1]]] for d in training])
            trade = {}
            for share in SHARES:
                threshold = float(np.quantile(right_in_training, share))
                below = p < threshold
                trade[str(share)] = {
                    "abstains_more": int(sum(b and a["unanswerable"] and not a["abstained"] for b, a in zip(below, absent))),
                    "right_lost": int(sum(b and a["right"] for b, a in zip(below, absent))),
                }
            both = 0 < answerable.sum() < len(answerable)
            report[combination][name] = {"auc": round(float(roc_auc_score(answerable, p)), 2) if both else None, "trade": trade}
        print(combination, report[combination], flush=True)
    write_report(args.out, "abstention_model", report, table(report))


if __name__ == "__main__":
    main()
