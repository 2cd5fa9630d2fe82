"""The LM's likelihood of the question as a window ranker and as an abstention signal, beside the
fitted selector, on documentation question sets.

For every question the first stage retrieves ``passage_k`` passages and the fitted selector
(``DEFAULT_SELECTOR``) scores every candidate window (``nest_benchmarks.window_rows``, the rows ``benchmarks/fit_selector.py`` fits on).
The selector's best ``--top`` windows are then scored by the default LM: the mean log-probability
per token of the question after "Passage: <section title, window>" and after "Passage: (none)"
(query likelihood; their difference is how much the window makes the question likelier, PMI).
Reported per set:

* window recall with three windows: the selector's best three (non-overlapping), and the best
  three of its ``--top`` re-ranked by query likelihood;
* how well each signal tells the questions the documents do not answer from the answerable ones
  (ROC AUC, 0.5 is chance): the selector's best probability, the best query likelihood and the
  best PMI over the selector's three;
* seconds of LM scoring per question (this machine, shared; the selector itself is milliseconds).

    python results/lm-likelihood-signals/lm_signals.py --out results/lm-likelihood-signals \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

``--model gemma-3-270m`` scores with the larger base LM (``make setup-gemma``) instead of the default.

A domain is ``NAME=INDEX:QA`` (a markdown-qa JSONL file). Writes ``signals.json`` and prints the
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from nest_benchmarks.window_rows import domain_rows
from nest_integrations import NestIndex, load_lm
from nest_integrations.policy.conversation import question_asked_now
from nest_integrations.policy.selection import DEFAULT_SELECTOR

PROMPT_TOKENS = 384
"""Window tokens kept in the LM's prompt (a long window is cut; the question is scored in full)."""


def question_log_probs(lm, question: str, windows: list[str]) -> np.ndarray:
    """Mean log-probability per token of ``question`` after each of ``windows`` ("" for none): (W,)."""
    tokenizer = lm.tokenizer
    question_ids = tokenizer(" " + question.strip(), add_special_tokens=False).input_ids
    tail = tokenizer("\n\nA question this passage answers:", add_special_tokens=False).input_ids
    sequences = []
    for window in windows:
        head = tokenizer("Passage:\n" + window.strip() if window else "Passage: (none)", add_special_tokens=False).input_ids
        sequences.append(head[:PROMPT_TOKENS] + tail + question_ids)
    length = max(map(len, sequences))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(sequences), length), pad)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):  # left-padded: the question ends every row
        ids[row, length - len(sequence) :] = torch.tensor(sequence)
        mask[row, length - len(sequence) :] = 1
    scored = len(question_ids)
    with torch.no_grad():  # logits of the positions that predict the question's tokens only
        logits = lm.model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), logits_to_keep=scored + 1
        ).logits.float()
    log_probs = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, -scored:, None])[..., 0]
    return log_probs.mean(-1).numpy()


def first_three(order: np.ndarray, row: dict) -> list[int]:
    """The first three candidates of ``order`` that overlap no earlier one in their document."""
    taken: list[tuple[str, int, int]] = []
    chosen: list[int] = []
    for i in map(int, order):
        c = row["candidates"][i]
        here = (c.passage.doc_id or c.passage.id, c.passage.doc_char_start + c.start, c.passage.doc_char_start + c.end)
        if any(d == here[0] and s < here[2] and here[1] < e for d, s, e in taken):
            continue
        taken.append(here)
        chosen.append(i)
        if len(chosen) == 3:
            break
    return chosen


def domain_signals(lm, index: NestIndex, qa: str, top: int) -> dict:
    """Per question: answerable or not, whether the selector's / the LM's three hold the answer,
    and the three abstention signals; with the seconds the LM took."""
    questions, seconds = [], 0.0
    for row in domain_rows(index, qa):
        if not len(row["labels"]):
            continue
        probabilities = DEFAULT_SELECTOR.probabilities(row["features"])
        order = np.argsort(-probabilities, kind="stable")
        best = order[:top]
        texts = [row["candidates"][int(i)].title + "\n" + row["candidates"][int(i)].passage.text[row["candidates"][int(i)].start : row["candidates"][int(i)].end] for i in best]
        started = time.perf_counter()
        scores = question_log_probs(lm, question_asked_now(row["query"]), [""] + texts)
        seconds += time.perf_counter() - started
        likelihood = scores[1:]
        by_lm = best[np.argsort(-likelihood, kind="stable")]
        selector_three = first_three(order, row)
        questions.append({
            "id": row["id"],
            "unanswerable": row["unanswerable"],
            "selector_three_hold": bool(row["labels"][selector_three].any()),
            "lm_three_hold": bool(row["labels"][first_three(by_lm, row)].any()),
            "best_probability": float(probabilities[order[0]]),
            "best_likelihood": float(likelihood[:3].max()),
            "best_pmi": float(likelihood[:3].max() - scores[0]),
        })
    return {"questions": questions, "lm_seconds_per_question": seconds / max(len(questions), 1)}


def summary(report: dict) -> dict:
    """The table's numbers for one set."""
    questions = report["questions"]
    answerable = [q for q in questions if not q["unanswerable"]]
    unanswerable = np.array([q["unanswerable"] for q in questions])

    def auc(key: str) -> float | None:  # a low value says "nothing answers"
        if unanswerable.all() or not unanswerable.any():
            return None
        return round(float(roc_auc_score(unanswerable, [-q[key] for q in questions])), 2)

    return {
        "answerable": len(answerable),
        "unanswerable": int(unanswerable.sum()),
        "selector_three": sum(q["selector_three_hold"] for q in answerable),
        "lm_reranked_three": sum(q["lm_three_hold"] for q in answerable),
        "auc_best_probability": auc("best_probability"),
        "auc_best_likelihood": auc("best_likelihood"),
        "auc_best_pmi": auc("best_pmi"),
        "lm_seconds_per_question": round(report["lm_seconds_per_question"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", action="append", required=True, help="NAME=INDEX:QA")
    parser.add_argument("--top", type=int, default=8, help="the selector's best windows the LM re-ranks")
    parser.add_argument("--model", default="default", help="the LM that scores (load_lm's name or path)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lm = load_lm(args.model)
    results = {}
    for spec in args.domain:
        name, rest = spec.split("=", 1)
        index_path, qa = rest.split(":", 1)
        report = domain_signals(lm, NestIndex.load(index_path), qa, args.top)
        results[name] = {"summary": summary(report), **report}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "signals.json").write_text(json.dumps(results, indent=1))
    print("| set | answerable | selector's three hold it | LM-re-ranked three hold it | unanswerable | AUC: selector's best probability | AUC: best question likelihood | AUC: best PMI | LM s / question |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, result in results.items():
        s = result["summary"]
        print(
            f"| {name} | {s['answerable']} | {s['selector_three']} | {s['lm_reranked_three']} | {s['unanswerable']} "
            f"| {s['auc_best_probability']} | {s['auc_best_likelihood']} | {s['auc_best_pmi']} | {s['lm_seconds_per_question']} |"
        )


if __name__ == "__main__":
    main()
