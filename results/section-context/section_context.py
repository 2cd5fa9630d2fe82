"""Does a chunk know which section it sits in? The headings a passage starts under, given to the first stage and to the selector.

``nest index build`` cuts a long section into several passages, and only the first holds the
section's heading: a passage that opens mid-section ("If you *really* run out of disk space...")
is embedded and searched without the title that names its subject ("Important note about free
space"), and its windows are read by the answer selector with no section title at all. Two ways
of giving it back are measured, each against the decoder as it is:

* **first stage**: every passage indexed (dense and BM25, the ``"title: text"`` both read) with
  the titles of the innermost two headings it starts under after its document's title
  (``"quickstart.rst / Important note about free space: ..."``); counted per set: the first
  4, 8 and 16 passages hold a gold answer, and, through the decoder's own plan with its fitted
  selector (``window_bench.item_row``: gate, answer windows, the token budget), the gate keeps
  a passage that holds it and the planned windows hold it;
* **selector**: a window with no heading above it in its passage is read under the headings
  its passage starts under (the ``cosine`` feature's titled text); the selector is fitted again
  for each set without it (leave one set out, ``benchmarks/fit_selector.py``'s fit) over the
  seven design sets, and each set counts the answerable questions whose three chosen windows
  hold the answer, both ways.

The headings a passage starts under are those its document's earlier passages leave open: the
heading path of the last block of the passage before it (that passage's own headings only), or
its own first heading's when it opens with one.

    python results/section-context/section_context.py --out results/section-context \\
        --domain attrs=IDX/attrs:benchmarks/domains/attrs/qa.jsonl ... \\
        --held-out restic=IDX/restic:benchmarks/domains/heldout/restic/qa.jsonl ...

Writes ``section_context.json`` and ``section_context.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Sequence

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_benchmarks.runner import run_config, set_items
from nest_benchmarks.selector_fit import fit, selected_recall
from nest_benchmarks.window_bench import domain_report
from nest_benchmarks.window_rows import cached_domain_rows
from nest_integrations import NestConfig, NestIndex
from nest_integrations.corpus.markdown_structure import copy_layout, parse_blocks
from nest_integrations.corpus.passages import Passage
from nest_integrations.policy.selection import CandidateWindow, candidate_windows
from nest_integrations.retrieval.hybrid import build_retriever

DEPTHS = (4, 8, 16)
"""First-stage depths counted; the decoder reads the first 8 (``passage_k``)."""
TITLE_HEADINGS = 2
"""Innermost headings added to a passage's indexed title: the section and the one above it."""


def start_paths(passages: Sequence[Passage]) -> dict[str, tuple[str, ...]]:
    """Passage id -> the heading path it starts under (see the module docstring); ``()`` for prose
    and for a document's passages before its first heading. ``passages`` in document order."""
    paths: dict[str, tuple[str, ...]] = {}
    carried: tuple[str, ...] = ()
    document = None
    for passage in passages:
        if passage.doc_id != document:
            carried, document = (), passage.doc_id
        blocks = parse_blocks(passage.text) if copy_layout(passage.text) is not None else ()
        opens_with_heading = bool(blocks) and blocks[0].kind == "heading"
        paths[passage.id] = blocks[0].heading_path if opens_with_heading else carried
        if blocks and blocks[-1].heading_path:
            carried = blocks[-1].heading_path
    return paths


def first_stage(index: NestIndex, qa: str, paths: dict[str, tuple[str, ...]]) -> dict:
    """Both first stages' counts (see the module docstring) over ``index``'s questions ``qa``."""
    titled = [
        dataclasses.replace(p, title=" / ".join((p.title, *paths[p.id][-TITLE_HEADINGS:]))) if paths[p.id] else p
        for p in index.passages
    ]
    retriever = build_retriever(titled, "hybrid", embedder=index.retriever.dense.embedder_name, show_progress=False)
    by_id = {p.id: p for p in index.passages}
    items = set_items(qa, index.passages, limits={})
    config = run_config({}, NestConfig().max_new_tokens)

    def titled_retrieve(query: str, k: int, *, exclude_ids: Sequence[str] = ()) -> list:
        return [(by_id[p.id], score) for p, score in retriever.retrieve(query, k)]  # every item asks "present": none excluded

    report = {}
    for way, retrieve in (("as now", index.retrieve), ("with section titles", titled_retrieve)):
        answerable = [item for item in items if not item.meta.get("unanswerable")]
        depth = {k: 0 for k in DEPTHS}
        for item in answerable:
            ranked = [p for p, _ in retrieve(item.query, max(DEPTHS))]
            for k in DEPTHS:
                depth[k] += any(answer_recall(p.text, item.meta["answers"]) for p in ranked[:k])
        plan = domain_report(_Retrieving(index, retrieve), items, config)["summary"]  # type: ignore[arg-type]
        report[way] = {"answerable": len(answerable), **{f"top {k}": n for k, n in depth.items()},
                       "kept": plan["answer_kept"], "planned windows": plan["window_recall"]}
    return report


class _Retrieving:
    """``index`` with its first stage replaced by ``retrieve``: what ``window_bench.item_row`` reads."""

    def __init__(self, index: NestIndex, retrieve: Callable) -> None:
        self._index, self.retrieve = index, retrieve

    def __getattr__(self, name: str):
        return getattr(self._index, name)


def titled_candidates(paths: dict[str, tuple[str, ...]]) -> Callable[[Sequence[Passage]], list[CandidateWindow]]:
    """The decoder's candidate windows of some passages, a window with no heading above it in its
    passage read under the headings its passage starts under (``paths``)."""

    def candidates_of(passages: Sequence[Passage]) -> list[CandidateWindow]:
        return [dataclasses.replace(c, heading_path=paths[c.passage.id]) if not c.heading_path else c for c in candidate_windows(passages)]

    return candidates_of


def table(report: dict) -> str:
    """The report's two Markdown tables."""
    ways = ("as now", "with section titles")
    first = [[name, held, way, *(r["first stage"][way][k] for k in ("answerable", "top 4", "top 8", "top 16", "kept", "planned windows"))]
             for name, r in report["sets"].items() for held in ["held out" if r["held out"] else "design"] for way in ways]
    second = [[name, "held out" if r["held out"] else "design", r["selector"]["as now"], r["selector"]["with section titles"]] for name, r in report["sets"].items()]
    return "\n".join([
        "## First stage: passages indexed under the headings they start under", "",
        markdown_table(["set", "", "first stage", "answerable", "top 4 hold it", "top 8", "top 16", "a kept passage holds it", "the planned windows hold it"], first), "",
        "## Selector: untitled windows read under the headings their passage starts under (fit without the set)", "",
        markdown_table(["set", "", "the three chosen windows hold it: as now", "with section titles"], second), "",
    ])


def main() -> None:
    parser = domain_parser(__doc__.split("\n\n")[0], "NAME=INDEX:QA, a set the selector is fitted on")
    parser.add_argument("--held-out", action="append", default=[], help="NAME=INDEX:QA, a set only scored")
    parser.add_argument("--cache", type=Path, help="Folder of the sets' window rows (pickles, NAME.pkl as the other scripts'), read when there")
    args = parser.parse_args()
    sets = {**{n: (s, False) for n, s in domain_specs(args.domain).items()}, **{n: (s, True) for n, s in domain_specs(args.held_out).items()}}
    report: dict = {"sets": {}}
    rows: dict = {"as now": {}, "with section titles": {}}
    for name, ((path, qa), held_out) in sets.items():
        index = NestIndex.load(path)
        paths = start_paths(index.passages)
        report["sets"][name] = {"held out": held_out, "first stage": first_stage(index, qa, paths)}
        rows["as now"][name] = cached_domain_rows(path, qa, args.cache / f"{name}.pkl" if args.cache else None)
        rows["with section titles"][name] = cached_domain_rows(
            path, qa, args.cache / f"{name}-section-titles.pkl" if args.cache else None, titled_candidates(paths)
        )
        print(name, report["sets"][name], flush=True)
    design = [name for name, (_, held_out) in sets.items() if not held_out]
    for name in sets:
        report["sets"][name]["selector"] = {
            way: selected_recall(fit([r for other in design if other != name for r in by_set[other]]), by_set[name]) for way, by_set in rows.items()
        }
    write_report(args.out, "section_context", report, table(report))


if __name__ == "__main__":
    main()
