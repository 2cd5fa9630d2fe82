"""NEST's own keys as a window scorer: the question's token keys matched to each window's.

The token datastore's key for a passage token is the LM's hidden state just before it
(``PassageEncoder``: after the chat prefix, at ``key_layer``). The question is read the same way,
as if it were a passage. Each question key finds its most similar key among a window's tokens
(cosine, both centred on the mean key of the set's retrieved passages: an LM's states share one
large direction that would otherwise dominate every cosine), and the window's score is the mean
of those best matches over the question's keys: late interaction, as ColBERT scores a passage
with its own encoder's token vectors. Read at the datastore's key layer (``ffn_input``, the
states the decoder's kNN search compares) and at earlier layers, whose states are closer to the
tokens themselves.

Every candidate answer window of the first stage's 8 passages is a row
(``nest_benchmarks.window_rows``), and the variants are scored as the selector's fit is
(``nest_benchmarks.selector_fit.score_variant``): the three windows (non-overlapping) that hold a
gold answer, on each design set under a fit over the other design sets, on each held-out set
under the fit over all of them; then how well the best window's probability marks the
unanswerable questions (AUC). The variants: ``selector`` (its eight features), ``+ token match
(LAYER)`` (and the score as a ninth column), and ``token match alone (LAYER)`` (the windows with
the best scores, nothing fitted).

    python results/lm-likelihood-signals/token_match.py --out results/lm-likelihood-signals \\
        --cache ROWS_DIR --key-layer layer:6 --key-layer ffn_input \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ... \\
        --held-out restic=IDX/restic:benchmarks/domains/heldout/restic/qa.jsonl ...

``--cache``: one pickle of rows a set, reused when present (``cached_domain_rows``). Writes
``token_match.json`` and ``token_match.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from nest_benchmarks.report_files import domain_specs, write_report
from nest_benchmarks.selector_fit import abstention_auc, score_variant, selected_recall, variants_table
from nest_benchmarks.window_rows import cached_domain_rows
from nest_integrations.model.lm import load_lm
from nest_integrations.store.encoder import EncodedPassage, PassageEncoder


def centred_unit(keys: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """float32 (L, d) ``keys`` less ``mean`` (d,), each row scaled to unit length."""
    centred = keys.astype(np.float32) - mean
    return centred / (np.linalg.norm(centred, axis=1, keepdims=True) + 1e-6)


def window_keys(encoded: EncodedPassage, start: int, end: int) -> np.ndarray:
    """The datastore keys of the tokens of characters ``[start, end)`` of a passage: (K, d)."""
    spans = encoded.char_spans
    return encoded.keys[(spans[:, 1] > start) & (spans[:, 0] < end) & encoded.valid]


def token_match_scores(rows: list[dict], encoder: PassageEncoder) -> list[np.ndarray]:
    """float64 (N,) token-match score of each row's N candidate windows (see the module docstring)."""
    passages = {p.id: p.text for r in rows for p in r["passages"]}
    ids = list(passages)
    encoded = dict(zip(ids, encoder.encode([passages[i] for i in ids])))
    mean = np.concatenate([e.keys[e.valid].astype(np.float32) for e in encoded.values()]).mean(0)
    questions = encoder.encode([r["query"] for r in rows])
    scores = []
    for row, question in zip(rows, questions):
        asked = centred_unit(question.keys[question.valid], mean)
        column = []
        for c in row["candidates"]:
            keys = window_keys(encoded[c.passage.id], c.start, c.end)
            column.append(float((asked @ centred_unit(keys, mean).T).max(1).mean()) if len(keys) and len(asked) else 0.0)
        scores.append(np.array(column))
    return scores


class ColumnScorer:
    """Ranks windows by one column of their features, nothing fitted."""

    def __init__(self, column: int) -> None:
        self.column = column

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(features, dtype=np.float64)[:, self.column]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", action="append", required=True, help="NAME=INDEX:QA, a design set")
    parser.add_argument("--held-out", action="append", default=[], help="NAME=INDEX:QA, scored by the fit over the design sets")
    parser.add_argument("--key-layer", action="append", required=True, help="where keys are read (PassageEncoder's key_layer)")
    parser.add_argument("--model", default="default", help="the LM whose keys are matched (the index's own by default)")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    specs = {"design": domain_specs(args.domain), "held_out": domain_specs(args.held_out)}
    rows = {
        name: cached_domain_rows(index, qa, args.cache / f"{name}.pkl" if args.cache else None)
        for group in specs.values() for name, (index, qa) in group.items()
    }
    design, held_out = list(specs["design"]), list(specs["held_out"])
    report = {"selector": score_variant(rows, design, held_out)}
    print("selector", report["selector"], flush=True)
    lm = load_lm(args.model, device="cpu")
    for layer in args.key_layer:
        encoder = PassageEncoder(lm, key_layer=layer)
        data = {}
        for name, rs in rows.items():
            scores = token_match_scores(rs, encoder)
            data[name] = [dict(r, features=np.hstack([r["features"], s[:, None]])) if len(r["labels"]) else r for r, s in zip(rs, scores)]
            print(layer, name, "scored", flush=True)
        report[f"+ token match ({layer})"] = score_variant(data, design, held_out)
        alone = ColumnScorer(-1)
        report[f"token match alone ({layer})"] = {
            "left_out": {name: selected_recall(alone, data[name]) for name in design},
            "held_out": {name: selected_recall(alone, data[name]) for name in held_out},
            "auc": {name: abstention_auc(alone, data[name]) for name in data},
        }
        print(layer, {k: v for k, v in report.items() if layer in k}, flush=True)
    answerable = {name: sum(not r["unanswerable"] for r in rs) for name, rs in rows.items()}
    write_report(args.out, "token_match", {"answerable": answerable, "key_layers": args.key_layer, "variants": report}, variants_table(answerable, report))


if __name__ == "__main__":
    main()
