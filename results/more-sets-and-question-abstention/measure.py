"""Two candidates measured without generating: the answer selector fitted on every question set
we have (not only the seven it was fitted on), and a question-level model that decides that
nothing answers among the questions the relevance gate lets through.

For every question of every domain the first stage retrieves ``passage_k`` passages and every
candidate window is a row of the selector's features (``nest_benchmarks.window_rows``, the rows
``benchmarks/fit_selector.py`` fits on).

1. Windows: the answerable questions whose three chosen windows hold the answer, per set, under
   the decoder's selector (``DEFAULT_SELECTOR``); under a fit over the *other* ``--fitted`` sets
   (the sets that selector was fitted on); under a fit over every other set but the
   ``--held-out`` ones; and under the pooled fit over every set but the held-out ones. A held-out
   set is scored, never fitted on.
2. Abstention: which questions the decoder's gate already turns away (the corpus-wide names
   check, then :class:`RelevanceGate`, both as the decoder applies them with default settings).
   Among the questions it lets through (the unanswerable ones, and the answerable ones whose
   first stage holds the answer), how well each question-level signal marks the unanswerable
   ones (ROC AUC; low is "nothing answers"), and what a logistic model over all of them flags
   when fitted on the other sets and cut where it flags 2% of their answerable questions:
   unanswerable questions it would turn away, answerable ones it would lose.

    python results/more-sets-and-question-abstention/measure.py --out results/more-sets-and-question-abstention \\
        --fitted attrs --fitted yargs ... --held-out coverage \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

A domain is ``NAME=INDEX:QA`` (a markdown-qa JSONL file or a bundled task's name, as in
``benchmarks/fit_selector.py``). Writes ``report.json`` and ``README.md``-ready tables to stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table
from nest_benchmarks.selector_fit import fit, selected_recall
from nest_benchmarks.window_rows import cached_domain_rows
from nest_integrations import NestIndex
from nest_integrations.core.config import NestConfig
from nest_integrations.policy.conversation import asked_sentences, question_asked_now
from nest_integrations.policy.relevance import RelevanceGate, content_words, text_stems
from nest_integrations.policy.selection import DEFAULT_SELECTOR, FEATURES

SIGNALS = ("best_window_probability", "best_cosine", "best_last_question_cosine", "best_coverage", "best_passage_cosine",
           "best_title_coverage", "words_absent_from_passages")
"""Question-level signals: the highest of each window feature over a question's windows (the
selector's probability first), and the share of the question's content words no retrieved
passage holds."""
FLAGGED_ANSWERABLE = 0.02
"""The abstention model is cut where it flags this share of its training sets' answerable questions."""


def question_signals(row: dict) -> np.ndarray:
    """float64 (len(SIGNALS),) signals of one question's row (zeros without a window)."""
    features = row["features"]
    if not len(features):
        return np.zeros(len(SIGNALS))
    column = {name: features[:, i] for i, name in enumerate(FEATURES)}
    held = set().union(*(text_stems(p.text) for p in row["passages"]))
    wanted = content_words(question_asked_now(row["query"]))
    return np.array([
        DEFAULT_SELECTOR.probabilities(features).max(), column["cosine"].max(), column["last_question_cosine"].max(),
        column["coverage"].max(), column["passage_cosine"].max(), column["title_coverage"].max(),
        len(wanted - held) / max(1, len(wanted)),
    ])


def questions(index: NestIndex, rows: list[dict]) -> list[dict]:
    """Per question: whether it is unanswerable, whether its first stage holds the answer, whether
    the gate turns it away (a name the corpus never mentions, or no passage kept) and its signals."""
    gate = RelevanceGate.from_config(NestConfig())
    terms = index.corpus_terms
    out = []
    for row in rows:
        turned = bool(terms.unmentioned(asked_sentences(row["query"]))) or not gate.decide(row["query"], row["passages"], index.relevance).kept
        out.append({"id": row["id"], "unanswerable": row["unanswerable"], "retrieved": row["retrieved"], "turned": turned,
                    "signals": question_signals(row)})
    return out


def let_through(qs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(signals (N, S), unanswerable (N,) bool) of the questions the gate lets through that are
    unanswerable or whose first stage holds the answer."""
    kept = [q for q in qs if not q["turned"] and (q["unanswerable"] or q["retrieved"])]
    return np.array([q["signals"] for q in kept]).reshape(-1, len(SIGNALS)), np.array([q["unanswerable"] for q in kept], dtype=bool)


def abstention_model(train: list[tuple[np.ndarray, np.ndarray]], test: tuple[np.ndarray, np.ndarray]) -> tuple[int, int]:
    """(unanswerable flagged, answerable flagged) on ``test`` by a logistic model fitted on ``train``
    (standardized signals, balanced classes), cut at ``1 - FLAGGED_ANSWERABLE`` of its training
    answerable questions' scores."""
    x = np.concatenate([s for s, _ in train])
    y = np.concatenate([u for _, u in train])
    mean, scale = x.mean(0), x.std(0) + 1e-9
    model = LogisticRegression(class_weight="balanced", max_iter=1000).fit((x - mean) / scale, y)
    cut = np.quantile(model.decision_function((x - mean) / scale)[~y], 1 - FLAGGED_ANSWERABLE)
    signals, unanswerable = test
    if not len(unanswerable):
        return 0, 0
    flagged = model.decision_function((signals - mean) / scale) > cut
    return int((flagged & unanswerable).sum()), int((flagged & ~unanswerable).sum())


def auc(low_marks: np.ndarray, unanswerable: np.ndarray) -> float | None:
    """ROC AUC of a low signal for the unanswerable questions; None without both kinds."""
    return round(float(roc_auc_score(unanswerable, -low_marks)), 3) if 0 < unanswerable.sum() < len(unanswerable) else None


def main() -> None:
    parser = domain_parser(__doc__, "NAME=INDEX:QA", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fitted", action="append", required=True, help="a set DEFAULT_SELECTOR was fitted on")
    parser.add_argument("--held-out", action="append", default=[], help="a set scored only")
    parser.add_argument("--cache", type=Path, help="folder of the window rows, one pickle a set (made on first use)")
    args = parser.parse_args()
    specs = domain_specs(args.domain)
    rows = {name: cached_domain_rows(index, qa, args.cache / f"{name}.pkl" if args.cache else None) for name, (index, qa) in specs.items()}
    fitting = [name for name in rows if name not in args.held_out]
    pooled = fit([r for name in fitting for r in rows[name]])
    windows = {}
    for name, rs in rows.items():
        windows[name] = {
            "answerable": sum(not r["unanswerable"] for r in rs),
            "first_stage": sum(r["retrieved"] for r in rs),
            "decoder_selector": selected_recall(DEFAULT_SELECTOR, rs),
            "fit_on_other_fitted_sets": selected_recall(fit([r for o in args.fitted if o != name for r in rows[o]]), rs),
            "fit_on_every_other_set": selected_recall(fit([r for o in fitting if o != name for r in rows[o]]), rs),
            "pooled_fit": selected_recall(pooled, rs),
        }
    asked = {name: questions(NestIndex.load(specs[name][0]), rs) for name, rs in rows.items()}
    through = {name: let_through(qs) for name, qs in asked.items()}
    abstention = {}
    for name, qs in asked.items():
        flagged, lost = abstention_model([through[o] for o in fitting if o != name], through[name])
        signals, unanswerable = through[name]
        abstention[name] = {
            "unanswerable": sum(q["unanswerable"] for q in qs),
            "unanswerable_turned_away_by_gate": sum(q["turned"] for q in qs if q["unanswerable"]),
            "answerable_in_first_stage_turned_away_by_gate": sum(q["turned"] for q in qs if q["retrieved"] and not q["unanswerable"]),
            "model_flags_unanswerable": flagged,
            "model_flags_answerable": lost,
            "auc": {signal: auc(signals[:, i], unanswerable) for i, signal in enumerate(SIGNALS)},
        }
    every = [through[name] for name in rows]
    pooled_auc = {signal: auc(np.concatenate([s[:, i] for s, _ in every]), np.concatenate([u for _, u in every])) for i, signal in enumerate(SIGNALS)}
    report = {"fitted": args.fitted, "held_out": args.held_out, "pooled_weights": dict(zip(FEATURES, pooled.weights)),
              "pooled_bias": pooled.bias, "windows": windows, "abstention": abstention, "pooled_auc": pooled_auc}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(markdown_table(["set", *windows[next(iter(windows))]], [[name, *w.values()] for name, w in windows.items()]))
    print(markdown_table(
        ["set", "unanswerable", "turned away by the gate", "answerable (first stage) turned away", "model flags unanswerable", "model flags answerable"],
        [[name, a["unanswerable"], a["unanswerable_turned_away_by_gate"], a["answerable_in_first_stage_turned_away_by_gate"],
          a["model_flags_unanswerable"], a["model_flags_answerable"]] for name, a in abstention.items()],
    ))
    print(markdown_table(["signal", "pooled AUC", *rows], [[s, pooled_auc[s], *(abstention[n]["auc"][s] for n in rows)] for s in SIGNALS]))


if __name__ == "__main__":
    main()
