"""What else the selector could read of a window, measured without generating: the question's
best cosine to one sentence of the window (the embedder reads a long block as a blur of its
sentences), its cosine to the window's text alone, without the section titles above it, and the
question's words counted over the whole window a Markdown or reStructuredText answer copies
(the paragraph, list item or code block), not over the sentence it was widened from.

The first two are appended to the selector's eight features (``window_rows``); the third
replaces the two word features (``overlap``, ``coverage``). Each variant is fitted the
selector's way (``selector_fit.score_variant``): left out one design set at a time, and on the
held-out sets fitted on every design set.

    python results/more-window-features/more_window_features.py --out results/more-window-features \\
        --cache ROWS --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl:design ... \\
        --domain coverage=IDX/coverage:benchmarks/domains/heldout/coverage/qa.jsonl:held-out

A domain is ``NAME=INDEX:QA:ROLE`` (ROLE ``design`` or ``held-out``). Writes
``more_window_features.json`` and ``more_window_features.md``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from nest_benchmarks.report_files import domain_parser, domain_specs
from nest_benchmarks.selector_fit import score_variant, variants_table
from nest_benchmarks.window_rows import cached_domain_rows
from nest_integrations import NestIndex
from nest_integrations.core.similarity import Relevance
from nest_integrations.corpus.chunking import sentence_spans
from nest_integrations.policy.relevance import text_stems
from nest_integrations.policy.selection import window_features

VARIANTS = {
    "the selector's eight": ("features", []),
    "words of the whole window": ("whole_window_words", []),
    "+ best sentence": ("features", [0]),
    "+ window alone": ("features", [1]),
    "+ both": ("features", [0, 1]),
}
"""Each variant's eight features (the selector's, or with words counted over the whole window:
:func:`whole_window_features`) and the columns of :func:`extra_features` after them."""


def extra_features(row: dict, relevance: Relevance) -> np.ndarray:
    """float32 (N, 2) for the N candidate windows of one question's ``row``: the question's best
    cosine to one of a window's sentences, and its cosine to the window's text without titles."""
    texts = [c.passage.text[c.start : c.end] for c in row["candidates"]]
    if not texts:
        return np.zeros((0, 2), dtype=np.float32)
    sentences, owners = [], []
    for i, text in enumerate(texts):
        for start, end in sentence_spans(text) or [(0, len(text))]:
            if text[start:end].strip():
                sentences.append(text[start:end])
                owners.append(i)
    best = np.full(len(texts), -1.0, dtype=np.float32)
    for owner, cosine in zip(owners, relevance(row["query"], sentences) if sentences else []):
        best[owner] = max(best[owner], float(cosine))
    return np.stack([best, np.asarray(relevance(row["query"], texts), dtype=np.float32)], 1)


def whole_window_features(row: dict, relevance: Relevance) -> np.ndarray:
    """float32 (N, 8) selector features of one question's ``row`` with each window's words
    (``CandidateWindow.words``) read over all of it, not over the sentence it was widened from."""
    candidates = [replace(c, words=frozenset(text_stems(c.passage.text[c.start : c.end]))) for c in row["candidates"]]
    return window_features(row["query"], candidates, row["passages"], relevance)


def main() -> None:
    parser = domain_parser(__doc__, "NAME=INDEX:QA:ROLE", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=str, default=None, help="folder for each domain's window rows (a pickle a domain)")
    args = parser.parse_args()
    specs = domain_specs(args.domain)
    rows, roles = {}, {}
    for name, (index_path, qa, role) in specs.items():
        rows[name] = cached_domain_rows(index_path, qa, None if args.cache is None else Path(args.cache) / f"{name}.pkl")
        relevance = NestIndex.load(index_path).relevance
        for row in rows[name]:
            row["extra"] = extra_features(row, relevance)
            row["whole_window_words"] = whole_window_features(row, relevance)
        roles[name] = role
    design = [n for n, r in roles.items() if r == "design"]
    held_out = [n for n, r in roles.items() if r == "held-out"]
    report = {}
    for variant, (eight, columns) in VARIANTS.items():
        widened = {name: [{**r, "features": np.concatenate([r[eight], r["extra"][:, columns]], 1)} for r in rs] for name, rs in rows.items()}
        report[variant] = score_variant(widened, design, held_out)
        print(variant, json.dumps(report[variant]["left_out"]), json.dumps(report[variant]["held_out"]), flush=True)
    answerable = {name: sum(not r["unanswerable"] for r in rs) for name, rs in rows.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "more_window_features.json").write_text(json.dumps({"answerable": answerable, "variants": report}, indent=2) + "\n")
    (args.out / "more_window_features.md").write_text(variants_table(answerable, report))


if __name__ == "__main__":
    main()
