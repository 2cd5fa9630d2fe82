"""Whether the answer window the decoder plans holds the answer, measured without generating
(``nest bench windows``).

For each question of an evaluation domain (:func:`~.runner.load_items`) the bench runs what
:class:`~nest_integrations.decoding.decoder.NestDecoder` runs before its first token, in the
same order, and stops there:

1. the first stage, ``config.passage_k`` passages (:func:`~.runner.first_stage`, ``present``);
2. the relevance gate (:func:`gate_kept`, as the decoder applies it);
3. for a question for which the gate kept a passage, the answer windows of the retrieved ones
   (:func:`~nest_integrations.decoding.prepare.choose_answer_windows`, the decoder's choice, fill
   windows that fit whole included)
   as the decoder plans them in tokens (:func:`planned_copies`, through the decoder's
   :func:`~nest_integrations.decoding.prepare.window_token_plan`): a window that does not close an answer runs on to its
   passage's end and no window follows it;
4. the planned tokens, in copy order, cut at ``config.max_new_tokens`` (:func:`planned_text`).

Window recall is :func:`~.metrics.answer_recall` of that text: whether the answer is in what
the decoder sets out to copy. It bounds NEST's answer recall from the plan alone: a generation
may still lose the answer (a window cut by max_new_tokens, the LM's check where
``check_answer_windows`` is on) or find it elsewhere (a question answered without a plan). Only retrieval and the embedder run, so a
domain is quick once its index is built.
"""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from nest_integrations import NestConfig, NestIndex, Passage
from nest_integrations.corpus.markdown_structure import copyable_tokens, section_ends_at, title_tokens
from nest_integrations.decoding.chunk_chain import first_new_token
from nest_integrations.decoding.prepare import PlannedCopy, choose_answer_windows, window_token_plan
from nest_integrations.policy.copy_policy import Window
from nest_integrations.policy.relevance import RelevanceGate
from .metrics import answer_recall
from .runner import first_stage, format_cell, gold_passage_ids, markdown_table
from .tasks import EvalItem

__all__ = [
    "domain_report",
    "gate_kept",
    "item_row",
    "planned_copies",
    "planned_text",
    "summarize",
    "funnel_markdown",
    "window_bench_markdown",
    "write_funnel",
    "write_window_bench",
]


def gate_kept(index: NestIndex, query: str, passages: Sequence[Passage], config: NestConfig) -> list[Passage]:
    """The passages the decoder lets into its datastore: those the relevance gate keeps
    (:class:`RelevanceGate` over ``index.relevance``), or all of them when the gate is off
    (``min_passage_relevance <= -1``) or the query is blank; none of none."""
    if config.min_passage_relevance <= -1.0 or not passages or not query.strip():
        return list(passages)
    return RelevanceGate.from_config(config).decide(query, list(passages), index.relevance).kept


def planned_copies(
    index: NestIndex, query: str, retrieved: Sequence[Passage], kept: Sequence[Passage], config: NestConfig
) -> list[PlannedCopy]:
    """The copies the decoder plans for ``query`` when the gate kept any passage: windows of the
    ``retrieved`` ones (best first), in copy order (:func:`~nest_integrations.decoding.prepare.window_token_plan`, the decoder's own
    rule, over the passages' tokens); empty when it plans none (no kept passage, not a question,
    ``answer_focus`` off). A window that does not stop the answer runs on to its section's end
    (:func:`_section_last`), past its passage's end into the chunk that goes on from it in its
    document (:meth:`~nest_integrations.store.datastore.TokenDatastore.following_chunk`, as the
    decoder adds it to the answer's candidates): one more copy, to that section's end. The
    LM's check, which may end such a copy sooner, is not run."""
    if not kept:
        return []
    by_id = {p.id: p for p in retrieved}

    def tokens_of(passage_id: str) -> tuple[str, np.ndarray]:
        text = _text_of(index, by_id, passage_id)
        return text, index.datastore.encoder.tokenize(text)[1]

    chosen = choose_answer_windows(query, retrieved, index.relevance, config, tokens_of)
    planned = window_token_plan(chosen, tokens_of)
    if not planned or planned[-1].stops or planned[-1].title:
        return planned
    run_on = planned[-1]
    text, spans = tokens_of(run_on.window.passage_id)
    planned[-1] = run_on._replace(last=_section_last(text, spans, run_on.first))
    here = index.datastore.index_of(run_on.window.passage_id)
    following = index.datastore.following_chunk(here) if here is not None else None
    if planned[-1].last < len(spans) - 1 or following is None:
        return planned
    passage = index.datastore.passages[following]
    next_text, next_spans = tokens_of(passage.id)
    first = first_new_token(by_id[run_on.window.passage_id], passage, next_spans)
    if first < len(next_spans) and not section_ends_at(next_text, int(next_spans[first, 0])):  # no new section opens it
        window = Window(passage.id, int(next_spans[first, 0]), len(next_text), run_on.window.score)
        planned.append(PlannedCopy(window, first, _section_last(next_text, next_spans, first), False))
    return planned


def _text_of(index: NestIndex, by_id: Mapping[str, Passage], passage_id: str) -> str:
    """The text of passage ``passage_id``: a retrieved one (``by_id``) or, for the chunk a
    run-on copy goes on into, the index's."""
    passage = by_id.get(passage_id)
    if passage is None:
        position = index.datastore.index_of(passage_id)
        assert position is not None
        passage = index.datastore.passages[position]
    return passage.text


def _section_last(text: str, spans: np.ndarray, first: int) -> int:
    """The last token, from ``first`` on, a copy takes before its section ends
    (:func:`~nest_integrations.corpus.markdown_structure.section_ends_at`, where the decoder
    ends a run-on copy); the passage's last token when no heading follows."""
    return next((i for i in range(first, len(spans)) if section_ends_at(text, int(spans[i, 1]))), len(spans) - 1)


def planned_text(index: NestIndex, passages: Sequence[Passage], planned: Sequence[PlannedCopy], max_new_tokens: int) -> tuple[str, int]:
    """The text of the planned windows' tokens, in copy order, cut after ``max_new_tokens`` of
    them, and its length in tokens. Each window's tokens are a verbatim slice of its passage
    (the token spans tile the text) less the hidden markup the decoder never copies (an anchor
    such as ``<a id="removeHeader"></a>`` names the answer but is not in it); where a window
    would run into the text before it (both a word or a sign, no white space between), a
    paragraph break comes first, one token of the budget, as the decoder sets the LM's."""
    by_id = {p.id: p for p in passages}
    pieces, budget = [], max_new_tokens
    for copy in planned:
        if budget <= 0:
            break
        text = _text_of(index, by_id, copy.window.passage_id)
        _, spans = index.datastore.encoder.tokenize(text)
        if copy.first >= len(spans):
            continue
        if copy.title:  # the section's title, without its heading's marks
            positions = title_tokens(text, spans, copy.first, copy.last)
        else:  # hidden markup (an anchor, a comment) is never copied
            copyable = copyable_tokens(text, spans)
            positions = [i for i in range(copy.first, copy.last + 1) if copyable[i]]
        opening = text[spans[positions[0], 0] : spans[positions[0], 1]] if positions else ""
        if pieces and opening[:1] and not opening[:1].isspace() and not pieces[-1][-1:].isspace():
            pieces.append("\n\n")
            budget -= 1
        last = min(copy.last, copy.first + budget - 1)
        pieces.append("".join(text[spans[i, 0] : spans[i, 1]] for i in positions if i <= last))
        budget -= max(0, last - copy.first + 1)
    return "".join(pieces), max_new_tokens - budget


def item_row(index: NestIndex, item: EvalItem, config: NestConfig) -> dict[str, Any]:
    """What the decoder would plan for ``item`` (see the module docstring), as a JSON row.

    Keys: ``item_id``, ``query``, ``unanswerable``, ``answers``, ``retrieved`` and ``kept``
    (passage ids), ``windows`` (``passage_id``, ``chars`` [start, end), ``tokens`` [first, last],
    ``probability``, ``stops``, ``title``), ``planned_tokens`` and ``planned_text``; for an answerable item
    ``window_recall`` (0/1: the answer in the planned text), ``answer_retrieved`` (the answer in a
    first-stage passage), ``answer_kept`` (the answer in a kept passage) and ``source_kept`` (the item's own passage kept; None when it names none); for an
    unanswerable one ``kept_any`` (the gate kept something NEST could copy from)."""
    hits, _ = first_stage(index, item, "present", config.passage_k)
    retrieved = [p for p, _ in hits]
    kept = gate_kept(index, item.query, retrieved, config)
    chat = bool(item.meta.get("chat", True))
    planned = planned_copies(index, item.query, retrieved, kept, config) if chat else []
    text, tokens = planned_text(index, retrieved, planned, config.max_new_tokens)
    unanswerable = bool(item.meta.get("unanswerable", False))
    row: dict[str, Any] = {
        "item_id": item.id,
        "query": item.query,
        "unanswerable": unanswerable,
        "answers": list(item.meta.get("answers") or []),
        "retrieved": [p.id for p in retrieved],
        "kept": [p.id for p in kept],
        "windows": [
            {"passage_id": w.window.passage_id, "chars": [w.window.start, w.window.end], "tokens": [w.first, w.last],
             "probability": w.window.score, "stops": w.stops, "title": w.title}
            for w in planned
        ],
        "planned_tokens": tokens,
        "planned_text": text,
    }
    if unanswerable:
        row["kept_any"] = bool(kept)
        return row
    answers = item.meta["answers"]
    source = item.meta.get("passage_id")
    row["window_recall"] = answer_recall(text, answers) if text else 0.0
    row["answer_retrieved"] = any(answer_recall(p.text, answers) for p in retrieved)
    row["answer_kept"] = any(answer_recall(p.text, answers) for p in kept)
    row["source_kept"] = None if source is None else bool(set(gold_passage_ids(index.passages, source)) & set(row["kept"]))
    return row


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts over one domain's rows (:func:`item_row`): ``items``, ``answerable``, ``planned``
    (answerable items with a window plan), ``window_recall`` (count of answerable items whose
    planned text holds the answer) and ``window_recall_rate`` (that over ``answerable``; None
    without answerable items), ``answer_retrieved``, ``answer_kept``, ``source_kept`` (over the items naming a source,
    ``with_source``), ``unanswerable`` and ``unanswerable_kept`` (those where the gate kept a passage)."""
    answerable = [r for r in rows if not r["unanswerable"]]
    sourced = [r for r in answerable if r["source_kept"] is not None]
    recalled = int(sum(r["window_recall"] for r in answerable))
    return {
        "items": len(rows),
        "answerable": len(answerable),
        "planned": sum(bool(r["windows"]) for r in answerable),
        "window_recall": recalled,
        "window_recall_rate": recalled / len(answerable) if answerable else None,
        "answer_retrieved": sum(r["answer_retrieved"] for r in answerable),
        "answer_kept": sum(r["answer_kept"] for r in answerable),
        "with_source": len(sourced),
        "source_kept": sum(r["source_kept"] for r in sourced),
        "unanswerable": len(rows) - len(answerable),
        "unanswerable_kept": sum(r["kept_any"] for r in rows if r["unanswerable"]),
    }


def domain_report(index: NestIndex, items: Sequence[EvalItem], config: NestConfig) -> dict[str, Any]:
    """``{"summary": summarize(rows), "items": rows}`` over ``items`` (one :func:`item_row` each)."""
    rows = [item_row(index, item, config) for item in items]
    return {"summary": summarize(rows), "items": rows}


def window_bench_markdown(report: Mapping[str, Any]) -> str:
    """The bench's table, one row per domain, under the command and settings that made it."""
    headers = ["domain", "index", "answerable", "window recall", "rate", "planned", "answer kept", "source kept", "unanswerable kept"]
    rows = []
    for name, domain in report["domains"].items():
        s = domain["summary"]
        rows.append([
            name, f"{domain['passages']} passages", s["answerable"], f"{s['window_recall']} of {s['answerable']}",
            s["window_recall_rate"], f"{s['planned']} of {s['answerable']}", f"{s['answer_kept']} of {s['answerable']}",
            f"{s['source_kept']} of {s['with_source']}" if s["with_source"] else None,
            f"{s['unanswerable_kept']} of {s['unanswerable']}" if s["unanswerable"] else None,
        ])
    config = report["config"]
    return "\n".join([
        "# Answer windows: is the answer in what the decoder plans to copy?",
        "",
        f"- command: `{report['command']}`",
        f"- date: {report['date']}; model: {report['model']}",
        f"- max_new_tokens {config['max_new_tokens']}, passage_k {config['passage_k']}, answer_windows "
        f"{config['answer_windows']} (and {config['fill_windows']} fill), min_passage_relevance {format_cell(float(config['min_passage_relevance']))}",
        "",
        markdown_table(headers, rows),
        "",
        "Window recall: the gold answer is in the planned windows' tokens, cut at max_new_tokens (no generation). "
        "Planned: a window plan exists. Answer kept: the answer is in a passage the gate kept. Source kept: the "
        "item's own passage was kept. Unanswerable kept: the gate kept a passage for a question the corpus does "
        "not answer. Per item: windows.json.",
        "",
    ])


def write_window_bench(domains: Mapping[str, Mapping[str, Any]], config: NestConfig, model: str, out_dir: Path) -> dict[str, Any]:
    """Write ``windows.json`` (per domain: summary and items) and ``README.md`` (the table) to
    ``out_dir``; ``domains`` maps a domain to its :func:`domain_report` plus ``passages`` (the
    index's size). Returns the report written."""
    report = {
        "command": shlex.join(["nest", *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": model,
        "config": config.model_dump(mode="json", exclude={"mode"}),
        "domains": dict(domains),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "windows.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "README.md").write_text(window_bench_markdown(report), encoding="utf-8")
    return report


FUNNEL_MODES = ("rag", "knnlm", "nest", "ra_nest")
"""The modes whose answer recall closes the funnel (the stages before it are NEST's)."""


def funnel_markdown(plan: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """Where answers are lost, over the answerable questions of one ``nest eval`` run: the first
    stage's ``passage_k`` passages hold the answer, the gate keeps one that does, the planned
    windows hold it (:func:`summarize` of ``plan``), the generated text holds it (each mode's
    answer recall in ``summary``); then what the copying modes did with the unanswerable ones."""
    answerable = plan["answerable"]
    recall = {row["mode"]: row.get("answer_recall") for row in summary["results"] if row["condition"] == "present"}

    def share(count: int) -> str:
        return f"{count} of {answerable} ({format_cell(count / answerable if answerable else None)})"

    rows = [
        [f"first stage: top {summary['config']['passage_k']} hold it", share(plan["answer_retrieved"])],
        ["the gate keeps a passage that holds it", share(plan["answer_kept"])],
        ["the planned answer windows hold it", share(plan["window_recall"])],
        *[[f"{mode}'s text holds it", format_cell(recall[mode])] for mode in FUNNEL_MODES if mode in recall],
    ]
    lines = [
        f"# Where answers are lost: {summary['task']}",
        "",
        f"- command: `{summary['command']}`",
        "",
        markdown_table(["stage", "answerable questions"], rows),
    ]
    if plan["unanswerable"]:
        abstained = {row["mode"]: row.get("abstained") for row in summary["results"] if row["condition"] == "present"}
        lines += [
            "",
            f"Unanswerable questions: the gate kept a passage for {plan['unanswerable_kept']} of {plan['unanswerable']}; "
            + ", ".join(f"{mode} abstained on {format_cell(abstained.get(mode))}" for mode in ("nest", "ra_nest") if mode in abstained)
            + " of them.",
        ]
    return "\n".join(lines) + "\n"


def write_funnel(index: NestIndex, summary: Mapping[str, Any], out_dir: Path, *, qa_path: Path | None = None) -> dict[str, Any]:
    """Plan the answer windows of the items of the ``nest eval`` run ``summary`` (same index,
    config and items; :func:`domain_report`) and write ``funnel.json`` (the plan per item) and
    ``funnel.md`` (:func:`funnel_markdown`) beside its summary. Returns the plan's summary."""
    from .runner import load_items

    config = NestConfig.model_validate(summary["config"])
    wanted = set(summary["item_ids"])
    items = [item for item in load_items(summary["task"], None, seed=summary["seed"], passages=index.passages, qa_path=qa_path) if item.id in wanted]
    plan = domain_report(index, items, config)
    (out_dir / "funnel.json").write_text(json.dumps(plan, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "funnel.md").write_text(funnel_markdown(plan["summary"], summary), encoding="utf-8")
    return plan["summary"]
