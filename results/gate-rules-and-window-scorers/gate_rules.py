"""Each rule of the relevance gate switched off alone: what it turns away and what it costs.

For every question of a set, the first stage's 8 passages go through the default gate
(``RelevanceGate.from_config(NestConfig())``) and through the gate with one rule off. A
*negative* is a question the set marks unanswerable (or any question of a set run with the
``absent`` condition: its own passage removed); a *positive* is any other. Counted per variant:
negatives for which the gate keeps a passage (NEST answers from it: a cited wrong answer) and
positives for which it keeps none (NEST abstains); and the questions whose kept passages (those
whose tokens NEST may copy beyond the planned answer windows) differ from the default gate's. The
variants:

* ``no cosine floor``: ``min_similarity`` -0.99 (the margin to the best passage stays);
* ``no coverage rule``: ``min_coverage`` 0;
* ``no floor, no coverage``: both;
* ``no unmentioned names`` / ``no scoped names`` / ``no multi-word names``: the checks of
  ``unmentioned_names``, ``unmentioned_identifiers`` and ``query_names`` answer "none".

    python results/gate-rules-and-window-scorers/gate_rules.py --out results/gate-rules-and-window-scorers \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl \\
        --domain attrs-off-topic=IDX/attrs:benchmarks/domains/off-topic/qa.jsonl \\
        --domain bio-absent=IDX/wiki:bio:absent ...

A domain is ``NAME=INDEX:QA[:CONDITION]``, QA a markdown-qa JSONL file or a bundled task's name,
CONDITION ``present`` (the default) or ``absent``. Writes ``gate_rules.json`` and ``gate_rules.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator
from unittest import mock

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.runner import first_stage, load_items
from nest_benchmarks.tasks import TASKS
from nest_integrations import NestConfig, NestIndex
from nest_integrations.policy import relevance

DEFAULT_GATE = relevance.RelevanceGate.from_config(NestConfig())

VARIANTS: dict[str, tuple[relevance.RelevanceGate, str | None]] = {
    "all rules": (DEFAULT_GATE, None),
    "no cosine floor": (dataclasses.replace(DEFAULT_GATE, min_similarity=-0.99), None),
    "no coverage rule": (dataclasses.replace(DEFAULT_GATE, min_coverage=0.0), None),
    "no floor, no coverage": (dataclasses.replace(DEFAULT_GATE, min_similarity=-0.99, min_coverage=0.0), None),
    "no unmentioned names": (DEFAULT_GATE, "unmentioned_names"),
    "no scoped names": (DEFAULT_GATE, "unmentioned_identifiers"),
    "no multi-word names": (DEFAULT_GATE, "query_names"),
}
"""Name -> (the gate, the check of ``nest_integrations.policy.relevance`` that finds nothing)."""


@contextlib.contextmanager
def check_off(name: str | None) -> Iterator[None]:
    """``relevance.<name>`` answering an empty list while the block runs (nothing when None)."""
    if name is None:
        yield
        return
    with mock.patch.object(relevance, name, lambda *args: []):
        yield


def domain_counts(index: NestIndex, qa: str, condition: str) -> dict:
    """Per variant: negatives with a kept passage and positives with none (see the module docstring)."""
    task, path = (qa, None) if qa in TASKS else ("markdown-qa", qa)
    config = NestConfig()
    items = load_items(task, None, passages=index.passages, qa_path=path)
    hits = {item.id: [p for p, _ in first_stage(index, item, condition, config.passage_k)[0]] for item in items}
    negative = {item.id: bool(item.meta.get("unanswerable")) or condition == "absent" for item in items}
    kept_by: dict[str, dict[str, list[str]]] = {}
    for name, (gate, check) in VARIANTS.items():
        with check_off(check):
            kept_by[name] = {item.id: [p.id for p in gate.decide(item.query, hits[item.id], index.relevance).kept] if hits[item.id] else [] for item in items}
    default = kept_by["all rules"]
    variants = {
        name: {
            "negatives_kept": sum(negative[i] and bool(kept[i]) for i in kept),
            "positives_dropped": sum(not negative[i] and not kept[i] for i in kept),
            "kept_passages_change": sum(kept[i] != default[i] for i in kept),
        }
        for name, kept in kept_by.items()
    }
    return {"questions": len(items), "negatives": sum(negative.values()), "variants": variants}


def table(report: dict) -> str:
    """The Markdown table of :func:`main`'s report."""
    rows = [
        [name, f"{counts['questions']} ({counts['negatives']})"]
        + [f"{v['negatives_kept']} / {v['positives_dropped']} ({v['kept_passages_change']})" for v in counts["variants"].values()]
        for name, counts in report.items()
    ]
    return markdown_table(["set", "questions (negatives)", *VARIANTS], rows)


def main() -> None:
    args = domain_parser(__doc__.split("\n\n")[0], "NAME=INDEX:QA[:CONDITION]").parse_args()
    report = {}
    for name, (path, qa, *condition) in domain_specs(args.domain).items():
        report[name] = domain_counts(NestIndex.load(path), qa, condition[0] if condition else "present")
        print(name, report[name], flush=True)
    write_report(args.out, "gate_rules", report, table(report))


if __name__ == "__main__":
    main()
