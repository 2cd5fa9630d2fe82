"""How many answer windows an answer should copy: whether the gold answer is in the planned
windows' text, cut at the token budget, for several window counts, on documentation question
sets and the bundled question domains; no generation.

For every answerable question whose retrieved passages the relevance gate keeps any of (the
decoder plans nothing otherwise) the first stage retrieves ``passage_k`` passages, the fitted
selector (``DEFAULT_SELECTOR``) ranks their windows once, and each rule keeps some of the best
six: a fixed count (``k3`` the release before, ``k4``, ``k5``), the best three and the fourth
when it fits whole and closes the answer (``k3+fill1``: the decoder's ``fitting_windows`` with
``answer_windows=3, fill_windows=1``, this release's default), or the windows whose probability
is at least a share of the best one's (``rel0.3-5``: 0.3 of it, five at most; a window count
that follows the selector's confidence). The kept windows are planned as the decoder plans them
(``window_token_plan``: titles, joined windows, a window that does not close the answer ends
the plan) and cut at ``--max-new-tokens`` (``nest_benchmarks.window_bench.planned_text``).
The copy that runs on past a last window that does not close an answer is not planned here,
so the counts sit a little below ``nest bench windows``'.

    python results/fill-window/window_count.py --out results/fill-window \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ... \\
        --domain fastify=IDX/fastify:markdown-docs

A domain is ``NAME=INDEX:QA``, QA a markdown-qa JSONL file or a bundled task's name. Writes
``window_count.json`` and ``window_count.md``.
"""

from __future__ import annotations

from typing import Callable

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.runner import first_stage, set_items
from nest_benchmarks.window_bench import gate_kept, planned_text
from nest_integrations import NestConfig, NestIndex
from nest_integrations.decoding.prepare import fitting_windows, window_token_plan
from nest_integrations.policy.copy_policy import Window
from nest_integrations.policy.selection import DEFAULT_SELECTOR

UNCUT = 10**9
"""A budget no plan reaches: the plan's whole length."""

Rule = Callable[[list[Window], Callable, int], list[Window]]


def share_of_best(share: float, most: int) -> Rule:
    """The best windows, at most ``most``, whose probability reaches ``share`` of the best one's."""
    return lambda ranked, tokens_of, budget: [w for i, w in enumerate(ranked[:most]) if i == 0 or w.score >= share * ranked[0].score]


RULES: dict[str, Rule] = {
    "k3": lambda ranked, tokens_of, budget: ranked[:3],
    "k4": lambda ranked, tokens_of, budget: ranked[:4],
    "k3+fill1": lambda ranked, tokens_of, budget: fitting_windows(ranked[:4], 3, budget, tokens_of),
    "k5": lambda ranked, tokens_of, budget: ranked[:5],
    "rel0.3-5": share_of_best(0.3, 5),
    "rel0.2-5": share_of_best(0.2, 5),
}


def domain_counts(index: NestIndex, qa: str, budget: int) -> dict:
    """Per rule: answerable questions whose planned text holds the answer, mean planned tokens,
    and plans longer than the budget (the answer ends cut mid-window)."""
    config = NestConfig(max_new_tokens=budget)
    held = {rule: 0 for rule in RULES}
    tokens = {rule: 0 for rule in RULES}
    over = {rule: 0 for rule in RULES}
    planned = 0
    for item in set_items(qa, index.passages, limits={}):
        if item.meta.get("unanswerable") or not item.meta.get("chat", True):
            continue
        passages = [p for p, _ in first_stage(index, item, "present", config.passage_k)[0]]
        if not gate_kept(index, item.query, passages, config):
            continue
        planned += 1
        ranked = DEFAULT_SELECTOR.select(item.query, passages, index.relevance, count=6)
        by_id = {p.id: p for p in passages}

        def tokens_of(passage_id: str) -> tuple[str, object]:
            text = by_id[passage_id].text
            return text, index.datastore.encoder.tokenize(text)[1]

        for name, rule in RULES.items():
            plan = window_token_plan(rule(ranked, tokens_of, budget), tokens_of)
            text, count = planned_text(index, passages, plan, budget)
            held[name] += int(bool(answer_recall(text, item.meta["answers"])))
            tokens[name] += count
            over[name] += int(planned_text(index, passages, plan, UNCUT)[1] > budget)
    return {"planned": planned, "held": held, "over_budget": over, "mean_tokens": {r: round(t / max(planned, 1), 1) for r, t in tokens.items()}}


def table(report: dict) -> str:
    """The Markdown table of :func:`main`'s report."""
    rows = [
        [name, counts["planned"], *(f"{counts['held'][r]} ({counts['mean_tokens'][r]:.0f} tok, {counts['over_budget'][r]} cut)" for r in RULES)]
        for name, counts in report.items()
    ]
    return markdown_table(["set", "planned", *RULES], rows)


def main() -> None:
    parser = domain_parser(__doc__.split("\n\n")[0], "NAME=INDEX:QA")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    report = {}
    for name, (path, qa) in domain_specs(args.domain).items():
        report[name] = domain_counts(NestIndex.load(path), qa, args.max_new_tokens)
        print(name, report[name], flush=True)
    write_report(args.out, "window_count", report, table(report))


if __name__ == "__main__":
    main()
