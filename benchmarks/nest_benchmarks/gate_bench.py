"""What the relevance gate lets through, measured without generating (``nest bench gate``).

For each biography item the first stage retrieves ``k`` passages twice: as usual
(``present``) and with the person's own summary removed (``absent``, as
``nest eval``'s absent condition). The gate then decides, exactly as the decoder
does (its :class:`~nest_integrations.policy.relevance.RelevanceGate` over the index's relevance function):

* present: whether the person's own summary is kept (a miss makes NEST write
  with the LM alone), and whether another person's passage is kept beside it;
* absent: whether any passage is kept (anything kept is another person's, so
  NEST would copy a wrong biography).

Only retrieval and the embedder run, no generation, so it is quick next to ``nest eval``
(docs/method.md, Knowing when not to copy, has the time for 200 people).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nest_integrations import NestConfig
from nest_integrations.policy.relevance import RelevanceGate
from .runner import first_stage, gold_passage_ids
from .tasks import bio_items

__all__ = ["gate_report"]


def gate_report(index: Any, *, n: int = 200, seed: int = 1, k: int = 8, out_dir: Path | None = None) -> dict[str, Any]:
    """Gate decisions over ``n`` biography items of ``seed`` (see the module docstring).

    Args:
        index: a :class:`~nest_integrations.index.nest_index.NestIndex` over the people summaries.
        n, seed: the items (``bio_items(n, seed)``).
        k: first-stage passages per query (the decoder's ``passage_k``).
        out_dir: where ``gate.json`` (per item) and ``gate.md`` (the table) go; None writes nothing.

    Returns:
        ``{"present_own_kept", "present_other_kept", "absent_any_kept", "n", "misses", "wrong", "items"}``:
        counts, the names whose own summary was not kept, and the names for which
        another person's passage was kept (present or absent).
    """
    gate = RelevanceGate.from_config(NestConfig())  # the defaults a user who changes nothing decodes with
    rows = []
    for item in bio_items(n, seed=seed, passages=index.passages):
        own = set(gold_passage_ids(index.passages, item.meta["passage_id"]))
        row: dict[str, Any] = {"name": item.meta["name"]}
        for condition in ("present", "absent"):
            hits, _ = first_stage(index, item, condition, k)
            passages = [p for p, _ in hits]
            kept = gate.decide(item.query, passages, index.relevance).kept if passages else []
            row[condition] = [p.id for p in kept]
        row["own_kept"] = bool(own & set(row["present"]))
        row["other_present"] = bool(set(row["present"]) - own)
        row["other_kept"] = row["other_present"] or bool(row["absent"])
        rows.append(row)
    report = {
        "n": len(rows),
        "seed": seed,
        "k": k,
        "present_own_kept": sum(r["own_kept"] for r in rows),
        "present_other_kept": sum(r["other_present"] for r in rows),
        "absent_any_kept": sum(bool(r["absent"]) for r in rows),
        "misses": [r["name"] for r in rows if not r["own_kept"]],
        "wrong": [r["name"] for r in rows if r["other_kept"]],
        "items": rows,
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gate.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
        (out_dir / "gate.md").write_text(_markdown(report))
    return report


def _markdown(report: dict[str, Any]) -> str:
    n = report["n"]
    return "\n".join(
        [
            f"| {n} biographies (seed {report['seed']}, {report['k']} retrieved) | count |",
            "|---|---|",
            f"| present: own summary kept | {report['present_own_kept']} of {n} |",
            f"| present: another person's passage kept too | {report['present_other_kept']} of {n} |",
            f"| absent: any passage kept | {report['absent_any_kept']} of {n} |",
            f"| another person's passage kept (either condition) | {len(report['wrong'])} of {n} |",
            "",
            f"Own summary missed: {', '.join(report['misses']) or 'none'}.",
            f"Another person's passage kept for: {', '.join(report['wrong']) or 'none'}.",
            "",
        ]
    )
