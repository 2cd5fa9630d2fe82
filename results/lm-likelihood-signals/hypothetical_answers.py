"""The LM's own answer as a window scorer: windows ranked by their closeness to what the LM writes.

Hypothetical document embeddings (HyDE, Gao et al. 2022): the default LM answers the question
alone, in a sentence or two (greedy, at most 48 tokens, the chat template with a system line
asking for the exact function, option or command), and the passage embedder's cosine of that
answer to each candidate window (under its section titles, as the selector reads a window) is a
new column. An answer written without the documents may still be worded as the answer is
("pass ``kw_only=True`` to the field"), where the question is worded as a question. Two
columns: the hypothetical answer alone, and the question with it below.

Every candidate answer window of the first stage's 8 passages is a row
(``nest_benchmarks.window_rows``), and the variants are scored as the selector's fit is
(``nest_benchmarks.selector_fit.score_variant``): the three windows (non-overlapping) that hold a
gold answer, on each design set under a fit over the other design sets, on each held-out set
under the fit over all of them; then how well the best window's probability marks the
unanswerable questions (AUC).

    python results/lm-likelihood-signals/hypothetical_answers.py --out results/lm-likelihood-signals \\
        --cache ROWS_DIR --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ... \\
        --held-out restic=IDX/restic:benchmarks/domains/heldout/restic/qa.jsonl ...

``--cache``: one pickle of rows a set, reused when present (``cached_domain_rows``), and the LM's
answers of a set (``hypothetical_answers_NAME.json``), reused when present: writing them takes
the LM 2-4 s a question on 2 CPU cores. Writes ``hypothetical_answers.json`` (with every answer
the LM wrote) and ``hypothetical_answers.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from nest_benchmarks.report_files import domain_specs, write_report
from nest_benchmarks.selector_fit import score_variant, variants_table
from nest_benchmarks.window_rows import cached_domain_rows
from nest_integrations import NestIndex
from nest_integrations.model.lm import LoadedLM, load_lm

SYSTEM = "Answer the question in one or two sentences, naming the exact function, option or command."
MAX_NEW_TOKENS = 48


def hypothetical_answer(lm: LoadedLM, question: str) -> str:
    """The LM's greedy answer to ``question`` with no passage (at most :data:`MAX_NEW_TOKENS` tokens)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    ids = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = lm.model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return lm.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def cached_answers(lm_of: "LazyLM", rows: list[dict], cache_file: Optional[Path]) -> dict[str, str]:
    """Row id -> the LM's answer to the row's question, read from ``cache_file`` when it exists."""
    if cache_file is not None and cache_file.exists():
        return json.loads(cache_file.read_text())
    answers = {r["id"]: hypothetical_answer(lm_of(), r["query"]) for r in rows}
    if cache_file is not None:
        cache_file.write_text(json.dumps(answers, indent=1))
    return answers


class LazyLM:
    """Loads the LM on first use: with every answer cached, no LM is loaded."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lm: Optional[LoadedLM] = None

    def __call__(self) -> LoadedLM:
        if self._lm is None:
            self._lm = load_lm(self.name, device="cpu")
        return self._lm


def answer_columns(rows: list[dict], answers: dict[str, str], relevance) -> list[np.ndarray]:
    """float64 (N, 2) of each row's N candidate windows: the cosine of the LM's answer, and of the
    question with the answer below it, to the window under its section titles."""
    columns = []
    for r in rows:
        titled = [c.titled_text() for c in r["candidates"]]
        if not titled:
            columns.append(np.zeros((0, 2)))
            continue
        answer = answers[r["id"]]
        columns.append(np.column_stack([relevance(answer, titled), relevance(r["query"] + "\n" + answer, titled)]))
    return columns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", action="append", required=True, help="NAME=INDEX:QA, a design set")
    parser.add_argument("--held-out", action="append", default=[], help="NAME=INDEX:QA, scored by the fit over the design sets")
    parser.add_argument("--model", default="default", help="the LM that answers alone")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    specs = {"design": domain_specs(args.domain), "held_out": domain_specs(args.held_out)}
    design, held_out = list(specs["design"]), list(specs["held_out"])
    lm = LazyLM(args.model)
    rows, columns, answers = {}, {}, {}
    for group in specs.values():
        for name, (index, qa) in group.items():
            rows[name] = cached_domain_rows(index, qa, args.cache / f"{name}.pkl" if args.cache else None)
            answers[name] = cached_answers(lm, rows[name], args.cache / f"hypothetical_answers_{name}.json" if args.cache else None)
            columns[name] = answer_columns(rows[name], answers[name], NestIndex.load(index).relevance)
            print(name, "answered and scored", flush=True)
    report = {"selector": score_variant(rows, design, held_out)}
    for label, picked in (("+ the LM's answer", [0]), ("+ the question and the LM's answer", [1]), ("+ both", [0, 1])):
        data = {
            name: [dict(r, features=np.hstack([r["features"], c[:, picked]])) if len(r["labels"]) else r for r, c in zip(rs, columns[name])]
            for name, rs in rows.items()
        }
        report[label] = score_variant(data, design, held_out)
        print(label, report[label], flush=True)
    answerable = {name: sum(not r["unanswerable"] for r in rs) for name, rs in rows.items()}
    table = variants_table(answerable, report)
    write_report(args.out, "hypothetical_answers", {"answerable": answerable, "system": SYSTEM, "max_new_tokens": MAX_NEW_TOKENS,
                                                    "variants": report, "answers": answers}, table)


if __name__ == "__main__":
    main()
