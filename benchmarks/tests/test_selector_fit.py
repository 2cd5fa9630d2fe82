"""The selector's fit helpers: what a window scorer is credited with, and how its abstention is read."""

from __future__ import annotations

import numpy as np

from nest_benchmarks.selector_fit import LinearScorer, abstention_auc, score_variant, selected_recall
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.selection import CandidateWindow


def window(passage: Passage, start: int, end: int) -> CandidateWindow:
    return CandidateWindow(passage, 0, start, end, "", (), frozenset())


def tens(count: int) -> str:
    """``count`` runs of ten letters, each another letter: windows over other runs hold other text."""
    return "".join(chr(ord("a") + i % 26) * 10 for i in range(count))


def question(scores: list[float], labels: list[bool], *, unanswerable: bool = False, doc: str = "") -> dict:
    """A question whose windows are one feature column (``scores``), each over its own characters
    (its own text) of one passage (of document ``doc`` when given)."""
    passage = Passage("p", tens(len(scores)), doc_id=doc)
    candidates = [window(passage, 10 * i, 10 * i + 10) for i in range(len(scores))]
    return {"features": np.array(scores, dtype=np.float64)[:, None], "labels": np.array(labels), "candidates": candidates, "unanswerable": unanswerable}


class FirstColumn:
    def probabilities(self, features: np.ndarray) -> np.ndarray:
        return features[:, 0]


def test_selected_recall_counts_a_question_once_its_chosen_windows_hold_the_answer() -> None:
    rows = [
        question([0.9, 0.8, 0.7, 0.1], [False, False, True, False]),  # third best: held by three windows
        question([0.9, 0.8, 0.7, 0.1], [False, False, False, True]),  # fourth: not
        question([0.9, 0.1], [True, True], unanswerable=True),  # not counted
    ]
    assert selected_recall(FirstColumn(), rows, count=3) == 1
    assert selected_recall(FirstColumn(), rows, count=4) == 2


def test_selected_recall_skips_a_window_that_overlaps_a_chosen_one() -> None:
    passage = Passage("p", tens(4), doc_id="d")
    row = question([0.9, 0.8, 0.7], [False, False, True])
    row["candidates"] = [window(passage, 0, 20), window(passage, 10, 30), window(passage, 30, 40)]
    assert selected_recall(FirstColumn(), [row], count=2) == 1  # the second overlaps the first: the third is chosen


def test_selected_recall_skips_a_window_whose_text_a_chosen_one_holds() -> None:
    first, second = Passage("p", tens(2), doc_id="d"), Passage("q", tens(1), doc_id="e")
    row = question([0.9, 0.8, 0.7], [False, False, True])
    row["candidates"] = [window(first, 0, 20), window(second, 0, 10), window(Passage("r", "z" * 10, doc_id="f"), 0, 10)]
    assert selected_recall(FirstColumn(), [row], count=2) == 1  # the second repeats the first's text: the third is chosen


def test_abstention_auc_is_none_without_both_kinds_of_question() -> None:
    answerable = [question([0.9], [True]), question([0.2], [True])]
    assert abstention_auc(FirstColumn(), answerable) is None
    unanswerable = question([0.1], [False], unanswerable=True)
    assert abstention_auc(FirstColumn(), [*answerable, unanswerable]) == 1.0
    assert abstention_auc(FirstColumn(), [*answerable, question([0.5], [False], unanswerable=True)]) == 0.5


def test_score_variant_scores_each_design_set_by_a_fit_without_it() -> None:
    rng = np.random.default_rng(0)

    def questions(n: int) -> list[dict]:  # the answer's window has the highest feature, with noise
        rows = []
        for _ in range(n):
            labels = [False] * 6
            labels[int(rng.integers(6))] = True
            rows.append(question([(1.0 if y else 0.0) + float(rng.normal(0, 0.3)) for y in labels], labels))
        return rows

    rows = {"a": questions(20), "b": questions(20), "held": questions(10)}
    scored = score_variant(rows, ["a", "b"], ["held"])
    assert set(scored["left_out"]) == {"a", "b"} and set(scored["held_out"]) == {"held"}
    assert scored["left_out"]["a"] == selected_recall(LinearScorer(rows["b"]), rows["a"])
    assert scored["held_out"]["held"] >= 8  # a feature that marks the answer is learned from the other sets
    assert scored["auc"] == {"a": None, "b": None, "held": None}  # no unanswerable questions
