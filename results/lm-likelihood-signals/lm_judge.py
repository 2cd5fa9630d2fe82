"""The default (instruction-tuned) LM asked whether a window answers the question, as an
abstention signal beside the fitted selector's own probability, on documentation question sets.

For every question the first stage retrieves ``passage_k`` passages and the fitted selector
(``DEFAULT_SELECTOR``) scores every candidate window (``nest_benchmarks.window_rows``). Each of
the selector's best three windows, under its section title and cut to 300 tokens, goes into one
chat turn: "Documentation excerpt: <window> Question: <question> Does the excerpt answer the
question? Answer yes or no."; the signal is the log-odds of the assistant's first token being
yes over no (" yes", "yes", "Yes" against their "no" forms). Reported per set: how well a low
value marks the questions the documents do not answer (ROC AUC over the best of the three and
over the first alone, beside the selector's best probability), how well it tells the windows
that hold the answer from the others among the three of answerable questions, and the LM's
seconds per question.

    python results/lm-likelihood-signals/lm_judge.py --out results/lm-likelihood-signals \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ...

Writes ``judge.json`` (per question) and prints the Markdown table.
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

WINDOW_TOKENS = 300
"""Window tokens kept in the turn (a long window is cut)."""


def answer_token_ids(tokenizer, words: tuple[str, ...]) -> list[int]:
    """The token a reply opening with each of ``words`` starts with."""
    return [tokenizer(word, add_special_tokens=False).input_ids[0] for word in words]


def judge_log_odds(lm, question: str, windows: list[str]) -> list[float]:
    """log P(yes) - log P(no) of the reply's first token, one per window."""
    tokenizer = lm.tokenizer
    yes = answer_token_ids(tokenizer, (" yes", "yes", "Yes"))
    no = answer_token_ids(tokenizer, (" no", "no", "No"))
    odds = []
    for window in windows:
        excerpt = tokenizer.decode(tokenizer(window, add_special_tokens=False).input_ids[:WINDOW_TOKENS])
        turn = (f"Documentation excerpt:\n\n{excerpt}\n\nQuestion: {question}\n\n"
                "Does the excerpt answer the question? Answer yes or no.")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True, return_tensors="pt")
        if not torch.is_tensor(ids):
            ids = ids["input_ids"]
        with torch.no_grad():
            log_probs = torch.log_softmax(lm.model(input_ids=ids, logits_to_keep=1).logits[0, -1].float(), -1)
        odds.append(float(torch.logsumexp(log_probs[yes], 0) - torch.logsumexp(log_probs[no], 0)))
    return odds


def domain_judgements(lm, index: NestIndex, qa: str) -> dict:
    """Per question: answerable or not, the selector's best probability, the three windows'
    log-odds and whether each holds the answer; with the LM's seconds per question."""
    questions, seconds = [], 0.0
    for row in domain_rows(index, qa):
        if not len(row["labels"]):
            continue
        probabilities = DEFAULT_SELECTOR.probabilities(row["features"])
        best = np.argsort(-probabilities, kind="stable")[:3]
        chosen = [row["candidates"][int(i)] for i in best]
        texts = [(c.title + "\n" if c.title else "") + c.passage.text[c.start : c.end] for c in chosen]
        started = time.perf_counter()
        odds = judge_log_odds(lm, question_asked_now(row["query"]), texts)
        seconds += time.perf_counter() - started
        questions.append({
            "id": row["id"],
            "unanswerable": row["unanswerable"],
            "best_probability": float(probabilities[best[0]]),
            "log_odds": odds,
            "holds": [bool(row["labels"][int(i)]) for i in best],
        })
    return {"questions": questions, "lm_seconds_per_question": seconds / max(len(questions), 1)}


def summary(report: dict) -> dict:
    """The table's numbers for one set."""
    questions = report["questions"]
    unanswerable = np.array([q["unanswerable"] for q in questions])

    def auc(values: list[float]) -> float | None:  # a low value says "nothing answers"
        if unanswerable.all() or not unanswerable.any():
            return None
        return round(float(roc_auc_score(unanswerable, -np.array(values))), 2)

    windows = [(o, h) for q in questions if not q["unanswerable"] for o, h in zip(q["log_odds"], q["holds"])]
    holds = [h for _, h in windows]
    return {
        "answerable": int((~unanswerable).sum()),
        "unanswerable": int(unanswerable.sum()),
        "auc_best_probability": auc([q["best_probability"] for q in questions]),
        "auc_best_log_odds": auc([max(q["log_odds"]) for q in questions]),
        "auc_first_log_odds": auc([q["log_odds"][0] for q in questions]),
        "window_auc": round(float(roc_auc_score(holds, [o for o, _ in windows])), 2) if any(holds) and not all(holds) else None,
        "lm_seconds_per_question": round(report["lm_seconds_per_question"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", action="append", required=True, help="NAME=INDEX:QA (a markdown-qa JSONL file)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lm = load_lm("default")
    report = {}
    for spec in args.domain:
        name, rest = spec.split("=", 1)
        path, qa = rest.split(":", 1)
        report[name] = domain_judgements(lm, NestIndex.load(path), qa)
        report[name]["summary"] = summary(report[name])
        print(name, report[name]["summary"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "judge.json").write_text(json.dumps(report, indent=1) + "\n")
    headers = ["set", "answerable", "unanswerable", "AUC: selector's best probability", "AUC: best log-odds of the three",
               "AUC: log-odds of the first", "windows that hold it vs the others (AUC)", "LM s / question"]
    keys = ["answerable", "unanswerable", "auc_best_probability", "auc_best_log_odds", "auc_first_log_odds", "window_auc", "lm_seconds_per_question"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += [f"| {name} | " + " | ".join(str(r["summary"][k]) for k in keys) + " |" for name, r in report.items()]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
