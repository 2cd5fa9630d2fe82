"""Evaluation runner: every decoding mode on the same items in one run.

:func:`run_eval` draws the items of a task (see :mod:`.tasks`) from the index's
own corpus, generates with each mode (base, rag, knnlm, nest, ra_nest), scores
every output with :func:`score_item` and writes ``items.jsonl``,
``summary.json`` and ``summary.md``. For the completion task it also reports
:func:`perplexity` of the true continuation under each mode's mixture.

Domains and their commands (all five modes on the same items):

* biographies: ``nest eval --task bio --n 100`` (present and absent);
* question answering over the Wikipedia summaries: ``nest eval --task wiki-qa
  --n 100`` (questions about the people of the default index; ``-d`` an index
  of all summaries for every topic);
* technical documentation (standard-library docstrings):
  ``nest eval --task docs`` over whole documents, ``nest eval --task docs
  --docs-chunking splitter`` over LangChain's default splitter chunks (the
  index is built once into the cache, see
  :func:`~nest_benchmarks.docs_corpus.docs_passages`);
* Markdown documentation as users keep it (the Fastify reference docs, with
  follow-up and unanswerable questions): ``nest eval --task markdown-docs``
  with ``--docs-chunking cli``, ``splitter`` (LangChain) or ``sentence``
  (LlamaIndex), see :func:`~nest_benchmarks.markdown_docs.markdown_passages`;
  the same over a second project's docs (the Pino logger's API reference):
  ``nest eval --task markdown-docs-pino``.

Every task reports attribution, :func:`~.metrics.seam_ok_rate` (copies that
start where a reader accepts them), the repetition rate
(:func:`~.metrics.is_repetitive`), the markup-copied rate
(:func:`~.metrics.copied_markup`), tokens per forward and speed against base
and against in-context RAG; the question tasks answer recall (over the
answerable questions), and where questions are unanswerable how often a mode
cites a source anyway (:func:`~.metrics.unanswerable_scores`); biographies
also :func:`~.metrics.fragment_answer`.

Protocol (documented in every summary under ``"protocol"``):

* Conditions. ``present``: first-stage retrieval as usual. ``absent``: the
  item's own passage (``meta["passage_id"]``, with every chunk whose
  ``doc_id`` it is) is removed from the first-stage hits, for every mode (rag
  included), so the datastore and the prompt context never contain it; an
  unanswerable question has no passage and runs as in ``present``.
* Shared hits. First-stage retrieval runs once per item and condition and the
  same hits are passed to every mode; its time is added to ``wall_s`` and
  ``retrieval_s`` of every mode except base, which retrieves nothing.
* Keys. With precomputed keys every generation reads the index's datastore.
  With lazy keys every generation gets a fresh datastore with no key cached, so
  each one pays the encoding of its own passages (``encode_s``) and no mode
  profits from another mode's cache.
* One untimed warm-up generation runs before the first timed one.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from nest_integrations import NestConfig, NestDecoder, NestIndex, Passage
from nest_integrations.core.config import MODES
from nest_integrations.decoding.decoder import ScoredPassages
from nest_integrations.store.datastore import TokenDatastore
from .docs_corpus import DOCS_CHUNKINGS, docs_passages
from .markdown_docs import MARKDOWN_CHUNKINGS, markdown_passages
from .metrics import (
    aggregate,
    answer_recall,
    copied_markup,
    fragment_answer,
    garbled_model_text,
    model_text_in_code,
    is_repetitive,
    opens_with_entity,
    opens_with_other_name,
    rouge_scores,
    seam_ok_rate,
    span_integrity,
    spans_tile_text,
    tokens_per_forward,
    unanswerable_scores,
    year_precision,
)
from .tasks import FILE_TASKS, QA_TASKS, TASK_MAX_NEW_TOKENS, TASKS, EvalItem, get_task

__all__ = [
    "CONDITIONS",
    "DOCS_DOMAIN_CHUNKINGS",
    "MARKDOWN_TASK_DOCS_SETS",
    "SAMPLED_SET_ITEMS",
    "TASK_METRICS",
    "docs_domain_passages",
    "evaluate_item",
    "perplexity",
    "run_eval",
    "score_item",
    "set_items",
]

logger = logging.getLogger(__name__)

CONDITIONS: tuple[str, ...] = ("present", "absent")

DEFAULT_N = 100
"""Items drawn when no ``n`` is given (bio, completion, wiki-qa)."""

RUNNER_KEYS = frozenset({"mode", "max_new_tokens", "use_chat_template"})
"""Config fields the runner sets itself (per call or by argument)."""

COMMON_METRICS: tuple[str, ...] = (
    "attribution_ratio",
    "mean_copied_span_tokens",
    "span_integrity",
    "spans_tile",
    "seam_ok_rate",
    "repetitive",
    "garbled",
    "model_text_in_code",
    "markup_copied",
    "cited_unanswerable",
    "unanswerable_attribution",
    "abstained",
    "wall_s",
    "retrieval_s",
    "encode_s",
    "decode_s",
    "new_tokens",
    "forward_passes",
    "tokens_per_forward",
    "datastore_fallback",
)
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "bio": ("rouge1", "rougeL", "year_precision", "opens_with_entity", "opens_with_other_name", "fragment_answer"),
    "completion": ("rouge1", "rougeL"),
    **{task: ("answer_recall",) for task in sorted(QA_TASKS)},
}
"""Task-specific per-item metrics (every task also gets :data:`COMMON_METRICS`; all but
``datastore_fallback``, added by :func:`evaluate_item`, come from :func:`score_item`)."""

_TABLE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "bio": (
        ("rouge1", "ROUGE-1"),
        ("rougeL", "ROUGE-L"),
        ("year_precision", "year prec."),
        ("opens_with_entity", "opens with name"),
        ("opens_with_other_name", "opens with other name"),
        ("fragment_answer", "fragment"),
    ),
    "completion": (("rouge1", "ROUGE-1"), ("rougeL", "ROUGE-L"), ("perplexity", "perplexity")),
    **{task: (("answer_recall", "answer recall"),) for task in sorted(QA_TASKS)},
}
_SHARED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("attribution_ratio", "attribution"),
    ("mean_copied_span_tokens", "mean span (tok)"),
    ("span_integrity", "span integrity"),
    ("seam_ok_rate", "seam ok"),
    ("repetitive", "repetition"),
    ("garbled", "garbled model text"),
    ("model_text_in_code", "model text in code"),
    ("markup_copied", "markup copied"),
    ("cited_unanswerable", "cited on unanswerable"),
    ("unanswerable_attribution", "attribution on unanswerable"),
    ("abstained", "abstained on unanswerable"),
    ("datastore_fallback", "LM fallback"),
    ("tokens_per_forward", "tok/fwd"),
    ("new_tokens", "new tok"),
    ("wall_s", "wall s"),
    ("speedup_vs_base", "speed vs base"),
    ("speedup_vs_rag", "speed vs rag"),
)
_WHEN_MEASURED = frozenset({"cited_unanswerable", "unanswerable_attribution", "abstained"})
"""Columns shown only when some row has a value (tasks with unanswerable questions)."""

PROTOCOL = (
    "conditions: absent removes the item's own passage (and its chunks) from first-stage hits for every mode "
    "(unanswerable questions have none); "
    "hits are retrieved once per item and condition and shared by all modes, their time added to "
    "wall_s and retrieval_s of every non-base mode; lazy-key indexes give each generation a fresh "
    "datastore (encode_s is paid per generation), precomputed ones are read as they are; "
    "one untimed warm-up generation; speedup_vs_base = mode tokens/s / base tokens/s (new_tokens / wall_s, "
    "same condition), so a mode that stops earlier gains nothing from writing less; speedup_vs_rag the same "
    "against rag; repetitive: the text repeats a word 4-gram 3+ times more than its sources do (occurrences copied "
    "from different places of the sources are theirs), or two copied spans share 16+ source characters; garbled: a model-written span holds 3+ one-word lines in a row, empty or stitched link markup, or a word 3 times in a row; model_text_in_code: the LM wrote text (not a fence, not white space) inside a code block that holds copied text; markup_copied: a copied span takes an HTML comment, front matter, link-reference definition, "
    "HTML tag, heading line, reStructuredText title underline or explicit markup line (a MyST target too), what docutils does not show of a paragraph's closing ::, or a colon fence's line (:::{note}, :::) from outside its source's code fences; answer_recall and attribution over answerable questions; "
    "cited_unanswerable (attribution > 0), unanswerable_attribution and abstained (the answer says the documents "
    "do not cover the question: finish_reason not_covered) over unanswerable ones."
)


MARKDOWN_TASK_DOCS_SETS: dict[str, str] = {"markdown-docs": "fastify", "markdown-docs-pino": "pino"}
"""The Markdown documentation tasks and the bundled docs set (:func:`~.markdown_docs.markdown_passages`)
each one asks about."""

DOCS_DOMAIN_CHUNKINGS: dict[str, tuple[str, ...]] = {
    "docs": DOCS_CHUNKINGS, **{task: MARKDOWN_CHUNKINGS for task in MARKDOWN_TASK_DOCS_SETS}
}
"""The documentation tasks whose index the CLI builds from bundled documents, and their chunkings."""


# --------------------------------------------------------------------------- validation


def check_modes(modes: Iterable[str]) -> tuple[str, ...]:
    """Validated modes as a tuple.

    Raises:
        ValueError: if ``modes`` is empty, repeats a mode, or names an unknown one.
    """
    return checked_choices(modes, MODES, "mode")


def checked_choices(values: Iterable[str], allowed: Sequence[str], what: str) -> tuple[str, ...]:
    """``values`` as a tuple: non-empty, without repeats, each one of ``allowed`` (else ValueError)."""
    values = tuple(values)
    if not values:
        raise ValueError(f"at least one {what} is needed")
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f"unknown {what}s {unknown}; choose from {tuple(allowed)}")
    if len(set(values)) != len(values):
        raise ValueError(f"{what}s repeat: {list(values)}")
    return values


def _check_conditions(
    task: str, conditions: Iterable[str] | None, items: Sequence[EvalItem]
) -> tuple[str, ...]:
    """Validated conditions; default ``("present", "absent")`` for bio, ``("present",)`` otherwise.

    Raises:
        ValueError: empty, repeated or unknown conditions, or ``absent`` for
            answerable items without ``meta["passage_id"]``.
    """
    if conditions is None:
        conditions = CONDITIONS if task == "bio" else ("present",)
    conditions = checked_choices(conditions, CONDITIONS, "condition")
    sourceless = [item for item in items if "passage_id" not in item.meta and not item.meta.get("unanswerable")]
    if "absent" in conditions and sourceless:
        raise ValueError(f"the absent condition needs items with a source passage; {task!r} items have none")
    return conditions


def run_config(config_overrides: Mapping[str, Any] | None, max_new_tokens: int) -> NestConfig:
    """The :class:`NestConfig` of a run: defaults, ``config_overrides``, then ``max_new_tokens``.

    Raises:
        ValueError: if the overrides set a field the runner controls
            (:data:`RUNNER_KEYS`) or are not valid config fields/values.
    """
    overrides = dict(config_overrides or {})
    clash = sorted(RUNNER_KEYS & set(overrides))
    if clash:
        raise ValueError(f"config_overrides cannot set {clash}: the runner sets them")
    return NestConfig(**overrides, max_new_tokens=max_new_tokens)


def _meta(item: EvalItem, key: str) -> Any:
    """``item.meta[key]``.

    Raises:
        ValueError: naming the item when the key is missing.
    """
    try:
        return item.meta[key]
    except KeyError:
        raise ValueError(f"item {item.id!r} has no meta[{key!r}]") from None


# --------------------------------------------------------------------------- items and hits


def load_items(
    task: str,
    n: int | None = None,
    *,
    seed: int = 0,
    passages: Sequence[Passage] | None = None,
    qa_path: str | Path | None = None,
) -> list[EvalItem]:
    """The items of ``task``.

    Args:
        task: a name of :data:`~.tasks.TASKS`.
        n: number of items, >= 1; None gives the task's default: every question
            for qa, docs, markdown-docs(-pino) and wiki-qa-hard, :data:`DEFAULT_N` drawn items otherwise.
        seed: sampling seed (bio, completion, wiki-qa; docs when ``n`` is given).
        passages: pool the bio/completion/wiki-qa items are drawn from
            (normally the index's corpus, so every item's source passage is in
            the index).
        qa_path: JSONL file of the qa task (required for it, refused otherwise).

    Raises:
        ValueError: unknown task, ``n < 1``, a missing/unexpected ``qa_path``, or
            fewer than ``n`` qualifying items.
    """
    builder = get_task(task)
    if n is not None and n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if task in ("docs", "wiki-qa-hard", *MARKDOWN_TASK_DOCS_SETS):
        return builder(n, seed)
    if task not in FILE_TASKS:
        if qa_path is not None:
            raise ValueError(f"qa_path is only used by the {' and '.join(sorted(FILE_TASKS))} tasks, not {task!r}")
        pool = None if passages is None else list(passages)
        return builder(DEFAULT_N if n is None else n, seed, passages=pool)
    if qa_path is None:
        raise ValueError(f"the {task} task needs qa_path (a JSONL file of questions and answers)")
    items = builder(qa_path)
    if n is not None and n > len(items):
        raise ValueError(f"asked for {n} {task} items but {qa_path} has {len(items)}")
    return items[:n]


SAMPLED_SET_ITEMS = {"bio": 24, "wiki-qa": 24}
"""Items :func:`set_items` takes by default of the tasks that sample theirs: the first 24."""


def set_items(qa: str, passages: Sequence[Passage], limits: Mapping[str, int] = SAMPLED_SET_ITEMS) -> list[EvalItem]:
    """The questions of one set as the scripts that read sets of questions take them: ``qa`` is a
    markdown-qa JSONL file, or a bundled task's name; ``passages`` are the index's, which the
    bundled tasks draw their questions from. ``limits``: how many items of each task named are
    taken (the biographies and the questions over the summaries give their first 24 by default);
    every item of any other (``{}``: every item of every task)."""
    task, path = (qa, None) if qa in TASKS else ("markdown-qa", qa)
    return load_items(task, limits.get(task), passages=passages, qa_path=path)


def docs_domain_passages(task: str, chunking: str) -> list[Passage]:
    """The passages of a documentation task's default index (:data:`DOCS_DOMAIN_CHUNKINGS`):
    :func:`~.docs_corpus.docs_passages` or :func:`~.markdown_docs.markdown_passages`.

    Raises:
        ValueError: for another task or a chunking the task does not offer.
    """
    if task not in DOCS_DOMAIN_CHUNKINGS:
        raise ValueError(f"{task!r} has no bundled documents; choose from {sorted(DOCS_DOMAIN_CHUNKINGS)}")
    if chunking not in DOCS_DOMAIN_CHUNKINGS[task]:
        raise ValueError(f"unknown {task} chunking {chunking!r}; choose from {DOCS_DOMAIN_CHUNKINGS[task]}")
    if task == "docs":
        return docs_passages(chunking)
    return markdown_passages(chunking, MARKDOWN_TASK_DOCS_SETS[task])


def gold_passage_ids(passages: Sequence[Passage], gold_id: str) -> list[str]:
    """Ids of the passages that are the gold passage ``gold_id`` or one of its chunks
    (``doc_id == gold_id``)."""
    return [p.id for p in passages if gold_id in (p.id, p.doc_id)]


def doc_positions_of(passages: Sequence[Passage]) -> dict[str, tuple[str, int]]:
    """Passage id -> ``(document id, character offset of the passage in it)``; a whole
    document is its own document at offset 0."""
    return {p.id: (p.doc_id or p.id, p.doc_char_start) for p in passages}


def check_gold_in_index(items: Sequence[EvalItem], passages: Sequence[Passage]) -> None:
    """Every item's ``meta["passage_id"]`` (when it has one) must be a passage or a
    document of ``passages``.

    Raises:
        ValueError: naming the missing ids (e.g. the docs task over an index
            not built from :func:`~.docs_corpus.docs_corpus`).
    """
    known = {p.id for p in passages} | {p.doc_id for p in passages if p.doc_id}
    missing = sorted({item.meta["passage_id"] for item in items if "passage_id" in item.meta} - known)
    if missing:
        raise ValueError(f"the index holds none of the gold passages {missing[:5]} (of {len(missing)} missing)")


def first_stage(index: NestIndex, item: EvalItem, condition: str, k: int) -> tuple[ScoredPassages, float]:
    """First-stage passages for ``item`` under ``condition`` and the seconds it took.

    ``absent`` excludes the item's own passage (``meta["passage_id"]``) and
    every chunk of it (:func:`gold_passage_ids`).

    Raises:
        ValueError: unknown condition, or ``absent`` for an answerable item without a passage id.
    """
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; choose from {CONDITIONS}")
    removes_gold = condition == "absent" and not item.meta.get("unanswerable")
    excluded = gold_passage_ids(index.passages, _meta(item, "passage_id")) if removes_gold else []
    start = time.perf_counter()
    hits = index.retrieve(item.query, k, exclude_ids=excluded)
    return hits, time.perf_counter() - start


def fresh_lazy_datastore(index: NestIndex) -> TokenDatastore:
    """A lazy datastore over the index's passages with the index's encoder and key codec and
    no key cached: passages are encoded on first use (cold keys). It knows every passage, as
    the index's own datastore does for ``nest generate``, so a copy can run on into a chunk
    that was not retrieved."""
    return TokenDatastore(index.passages, index.datastore.encoder, codec=index.datastore.codec)


def decoder_over(index: NestIndex, datastore: TokenDatastore, config: NestConfig) -> NestDecoder:
    """The index's decoder (:meth:`~nest_integrations.NestIndex.decoder`: its LM, retriever,
    relevance gate, calibration and corpus words) over ``datastore``, with the calibration the
    config needs fitted now, not inside a timed generation."""
    if config.alpha is None or config.tau is None:
        index.calibration()
    return index.decoder(config, datastore=datastore)


def eval_decoder(index: NestIndex, config: NestConfig) -> NestDecoder:
    """The decoder for one timed generation: the index's datastore when its keys
    are precomputed, else a fresh lazy one (see the module docstring)."""
    datastore = index.datastore if index.datastore.is_precomputed else fresh_lazy_datastore(index)
    return decoder_over(index, datastore, config)


# --------------------------------------------------------------------------- scoring


def _task_scores(item: EvalItem, text: str, task: str, abstained: bool) -> dict[str, Any]:
    """Quality metrics of ``text`` for ``task`` (see :data:`TASK_METRICS`). An ``abstained``
    answer (the documents do not cover the question) answers nothing, though its "see also"
    line may name a section whose title holds a gold answer."""
    if task in QA_TASKS:
        unanswerable = bool(item.meta.get("unanswerable", False))
        return {"answer_recall": None if unanswerable else 0.0 if abstained else answer_recall(text, _meta(item, "answers"))}
    scores: dict[str, Any] = rouge_scores(text, item.reference)
    if task == "bio":
        name = _meta(item, "name")
        scores.update(
            year_precision=year_precision(text, item.reference),
            opens_with_entity=opens_with_entity(text, name),
            opens_with_other_name=opens_with_other_name(text, name),
            fragment_answer=fragment_answer(text, name),
        )
    return scores


def _speed_scores(stats: Mapping[str, Any], first_stage_s: float) -> dict[str, Any]:
    """Latency split (seconds) and token counts from a ``stats`` dict.

    ``first_stage_s`` is added to ``wall_s`` and ``retrieval_s``.
    ``tokens_per_forward`` is ``new_tokens`` per decoding forward (prefill excluded),
    None when no forward ran.

    Raises:
        ValueError: if a stats key is missing.
    """
    keys = ("wall_s", "retrieval_s", "encode_s", "decode_s", "new_tokens", "forward_passes")
    missing = [k for k in keys if k not in stats]
    if missing:
        raise ValueError(f"output stats lack {missing}")
    scores = {key: stats[key] for key in keys}
    scores["wall_s"] += first_stage_s
    scores["retrieval_s"] += first_stage_s
    scores["tokens_per_forward"] = tokens_per_forward(stats) if stats["forward_passes"] else None
    return scores


def score_item(
    item: EvalItem,
    output: Mapping[str, Any],
    task: str,
    passages_by_id: Mapping[str, str],
    *,
    first_stage_s: float = 0.0,
    doc_positions: Mapping[str, tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """Per-item metrics of one generation.

    Args:
        item: the evaluated item.
        output: the generation as a dict (``NestOutput.to_dict()``).
        task: a name of :data:`TASK_METRICS`.
        passages_by_id: passage id -> full text, to check copied spans, their
            seams and the markup they take.
        first_stage_s: seconds of first-stage retrieval done outside the decoder
            for this output; added to ``wall_s`` and ``retrieval_s``.
        doc_positions: passage id -> ``(document id, offset in it)``
            (:func:`doc_positions_of`), so re-copies across overlapping chunks
            are found; None compares passages alone.

    Returns:
        ``attribution_ratio`` (from the output; None for an unanswerable item, whose
        attribution is ``unanswerable_attribution``) and ``mean_copied_span_tokens``,
        ``span_integrity`` in [0, 1], ``spans_tile`` (bool), ``seam_ok_rate``
        (in [0, 1], None when nothing was copied), ``repetitive`` (bool,
        :func:`~.metrics.is_repetitive`), ``garbled`` (bool, :func:`~.metrics.garbled_model_text`),
        ``model_text_in_code`` (bool, :func:`~.metrics.model_text_in_code`),
        ``markup_copied`` (bool) and
        ``copied_markup`` (the kinds, :func:`~.metrics.copied_markup`),
        ``cited_unanswerable`` and ``unanswerable_attribution``
        (:func:`~.metrics.unanswerable_scores` with ``meta["unanswerable"]``;
        None for answerable items), ``abstained`` (an unanswerable item's output says the
        documents do not cover it, ``finish_reason`` ``"not_covered"``; None for answerable items), the task metrics of
        :data:`TASK_METRICS` (ROUGE F1 in [0, 1] vs ``item.reference``; for bio
        also ``year_precision`` (None without years), the two opening checks
        and ``fragment_answer`` (bools); for the question tasks
        ``answer_recall`` in {0, 1}, 0 for an abstention, None for unanswerable items), the latency split in
        seconds (``wall_s``, ``retrieval_s``, ``encode_s``, ``decode_s``),
        ``new_tokens``, ``forward_passes`` and ``tokens_per_forward``.

    Raises:
        ValueError: unknown task, negative ``first_stage_s``, an output without
            ``text``/``spans``/``stats``, or an item lacking the meta its task needs.
    """
    if task not in TASK_METRICS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASK_METRICS)}")
    if first_stage_s < 0:
        raise ValueError(f"first_stage_s must be >= 0, got {first_stage_s}")
    integrity = span_integrity(output, passages_by_id)  # validates text and spans
    if not isinstance(output.get("stats"), Mapping):
        raise ValueError("output has no 'stats' mapping")
    markup = copied_markup(output, passages_by_id)
    unanswerable = bool(item.meta.get("unanswerable", False))
    abstained = output["stats"].get("finish_reason") == "not_covered"
    return {
        # An unanswerable question's attribution should be 0: it is reported apart
        # (unanswerable_attribution), not averaged into the attribution of answers.
        "attribution_ratio": None if unanswerable else float(output.get("attribution_ratio", 0.0)),
        "mean_copied_span_tokens": float(output.get("mean_copied_span_tokens", 0.0)),
        "span_integrity": integrity,
        "spans_tile": spans_tile_text(output),
        "seam_ok_rate": seam_ok_rate(output, passages_by_id),
        "repetitive": is_repetitive(output, doc_positions),
        "garbled": bool(garbled_model_text(output)),
        "model_text_in_code": bool(model_text_in_code(output)),
        "markup_copied": bool(markup),
        "copied_markup": markup,
        **unanswerable_scores(output, unanswerable),
        "abstained": abstained if unanswerable else None,
        **_task_scores(item, output["text"], task, abstained),
        **_speed_scores(output["stats"], first_stage_s),
    }


def generate_item(
    decoder: NestDecoder, item: EvalItem, mode: str, hits: ScoredPassages, **overrides: Any
) -> tuple[dict[str, Any], bool | None]:
    """One generation for ``item`` in ``mode`` over the given first-stage hits.

    Plain-text items (``meta["chat"]`` False) are generated without the chat template.

    Returns:
        The output dict and whether a datastore mode fell back to the LM alone
        (``stats.fallback_reason`` set); None for modes without a datastore.
    """
    output = decoder.generate(
        item.prompt,
        query=item.query,
        passages=hits,
        mode=mode,
        use_chat_template=bool(item.meta.get("chat", True)),
        **overrides,
    )
    fallback = output.stats.fallback_reason is not None
    return output.to_dict(), (fallback if NestConfig(mode=mode).uses_datastore else None)


def evaluate_item(
    index: NestIndex,
    config: NestConfig,
    item: EvalItem,
    task: str,
    mode: str,
    hits: ScoredPassages,
    first_stage_s: float,
    passages_by_id: Mapping[str, str],
    doc_positions: Mapping[str, tuple[str, int]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Generate (see :func:`eval_decoder`) and score one item in one mode.

    Returns:
        The output dict and its metrics (:func:`score_item` plus
        ``datastore_fallback``); the first-stage time is charged to every mode
        but base.
    """
    output, fallback = generate_item(eval_decoder(index, config), item, mode, hits)
    charged = 0.0 if mode == "base" else first_stage_s
    metrics = score_item(item, output, task, passages_by_id, first_stage_s=charged, doc_positions=doc_positions)
    metrics["datastore_fallback"] = fallback
    return output, metrics


def warm_up(index: NestIndex, config: NestConfig, item: EvalItem) -> None:
    """An untimed first-stage retrieval and short nest generation for ``item``,
    so lazily initialised models and kernels load before anything is timed."""
    hits = index.retrieve(item.query, config.passage_k)
    generate_item(eval_decoder(index, config), item, "nest", hits, max_new_tokens=2)


# --------------------------------------------------------------------------- perplexity


def _continuation_text(item: EvalItem) -> str:
    """The reference as the model would generate it after the prompt: verbatim
    for chat items, after one space for plain-text continuations."""
    return item.reference if item.meta.get("chat", True) else " " + item.reference.lstrip()


def perplexity(
    decoder: NestDecoder,
    items: Sequence[EvalItem],
    *,
    mode: str,
    passages_fn: Callable[[EvalItem], ScoredPassages],
) -> float:
    """Token-level perplexity of the items' references under ``mode``'s mixture.

    Each reference is scored teacher-forced by :meth:`NestDecoder.score`: one
    forward over prompt + reference, then the decoder's own mixture at every
    reference position -- p_LM for base/rag, the fixed-lambda mixture for
    knnlm, the RRC mixture for nest/ra_nest (rag context in the prompt for
    rag/ra_nest, relevance-gated datastore as in generation). Nothing is copied
    while scoring, so no datastore entry is masked.

    Args:
        decoder: the decoder whose datastore, gate and mixture are used.
        items: items with non-empty references (completion items normally).
        mode: any decoding mode; ``base`` gives the LM alone.
        passages_fn: item -> first-stage ``(Passage, score)`` hits.

    Returns:
        ``exp(-sum log p / number of tokens)`` over all reference tokens of all items.

    Raises:
        ValueError: unknown mode or an empty reference.
    """
    check_modes([mode])
    total_logp, total_tokens = 0.0, 0
    for item in items:
        scored = decoder.score(
            item.prompt,
            _continuation_text(item),
            query=item.query,
            passages=passages_fn(item),
            mode=mode,
            use_chat_template=bool(item.meta.get("chat", True)),
        )
        total_logp += float(scored.logp_mixture.sum())
        total_tokens += len(scored.token_ids)
    if total_tokens == 0:
        raise ValueError("no items to score")
    return math.exp(-total_logp / total_tokens)


# --------------------------------------------------------------------------- reporting


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def metric_keys(task: str) -> tuple[str, ...]:
    """All per-item metric names aggregated for ``task``."""
    return TASK_METRICS[task] + COMMON_METRICS


def summarize_records(
    records: Sequence[Mapping[str, Any]],
    task: str,
    modes: Sequence[str],
    conditions: Sequence[str],
) -> list[dict[str, Any]]:
    """One row per mode x condition (mode-major): ``mode``, ``condition`` and the
    :func:`aggregate` means of :func:`metric_keys`, plus ``speedup_vs_base``
    (mode tokens per wall second / base tokens per wall second in the same
    condition, so per generated token; None without base) and ``speedup_vs_rag``
    (the same against rag, the mode NEST must beat to be worth its index)."""
    rows = []
    for mode in modes:
        for condition in conditions:
            metrics = [r["metrics"] for r in records if r["mode"] == mode and r["condition"] == condition]
            rows.append({"mode": mode, "condition": condition, **aggregate(metrics, metric_keys(task))})
    for reference in ("base", "rag"):
        rate = {row["condition"]: ratio(row["new_tokens"], row["wall_s"]) for row in rows if row["mode"] == reference}
        for row in rows:
            row[f"speedup_vs_{reference}"] = ratio(ratio(row["new_tokens"], row["wall_s"]), rate.get(row["condition"]))
    return rows


def run_metadata(index: NestIndex, config: NestConfig) -> dict[str, Any]:
    """Command line, UTC date, model name, index info and config of a run."""
    return {
        "command": shlex.join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": index.lm.name,
        "index": index.info(),
        "config": config.model_dump(mode="json", exclude={"mode"}),
        "rrc": dict(zip(("alpha", "tau"), decoder_over(index, index.datastore, config).rrc_parameters(config))),
    }


def format_cell(value: Any) -> str:
    """A Markdown table cell: floats with 3 decimals, bools as yes/no, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (cells through :func:`format_cell`)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(format_cell(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented UTF-8 JSON."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _summary_markdown(summary: Mapping[str, Any]) -> str:
    """``summary.md``: run facts and one table row per mode x condition."""
    columns = [
        (key, header)
        for key, header in _TABLE_COLUMNS[summary["task"]] + _SHARED_COLUMNS
        if key not in _WHEN_MEASURED or any(r.get(key) is not None for r in summary["results"])
    ]
    headers = ["mode", "condition", "n"] + [header for _, header in columns]
    rows = [[r["mode"], r["condition"], r["count"]] + [r.get(key) for key, _ in columns] for r in summary["results"]]
    config = summary["config"]
    rrc = summary.get("rrc") or {}
    knobs = ", ".join(
        f"{k}={rrc.get(k) if config.get(k) is None else config[k]}"
        for k in ("passage_k", "token_k", "alpha", "tau", "delta", "gamma", "ra_gamma")
    )
    return "\n".join(
        [
            f"# NEST evaluation: {summary['task']}",
            "",
            f"- model: {summary['model']}; index: {summary['index']['passages']} passages, "
            f"precomputed keys: {summary['index']['precomputed_keys']}",
            f"- items: {summary['n_items']} (seed {summary['seed']}), max_new_tokens: {config['max_new_tokens']}",
            f"- config: {knobs}",
            f"- date: {summary['date']}",
            f"- command: `{summary['command']}`",
            "",
            markdown_table(headers, rows),
            "",
            f"Protocol: {summary['protocol']}",
            "",
        ]
    )


# --------------------------------------------------------------------------- the run


def run_eval(
    index: NestIndex,
    task: str,
    *,
    n: int | None = None,
    seed: int = 0,
    modes: Sequence[str] = MODES,
    conditions: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    out_dir: str | Path,
    qa_path: str | Path | None = None,
    config_overrides: Mapping[str, Any] | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Compare decoding modes on the same items of ``task`` in one run.

    Args:
        index: the NEST index; bio, completion and wiki-qa items are drawn
            from its corpus; the gold passages of docs (and of qa records that
            name one) must be in it.
        task: a name of :data:`~.tasks.TASKS`.
        n: number of items; None for the task's default (see :func:`load_items`).
        seed: item sampling seed.
        modes: decoding modes to compare.
        conditions: ``"present"`` and/or ``"absent"`` (see the module docstring);
            default both for bio, ``("present",)`` otherwise.
        max_new_tokens: generation budget per output; None for the task's
            default (:data:`~.tasks.TASK_MAX_NEW_TOKENS`: 64 for the bundled
            question sets, 256 for markdown-qa, 128 otherwise).
        out_dir: folder for ``items.jsonl``, ``summary.json``, ``summary.md``
            (created if needed; existing files are overwritten).
        qa_path: the qa task's JSONL file.
        config_overrides: :class:`NestConfig` fields (not mode, max_new_tokens,
            use_chat_template).
        show_progress: show a tqdm bar over generations.

    Returns:
        The summary (as written to ``summary.json``): task, items, seed, modes,
        conditions, command, date, model, index info, config, protocol and
        ``results``, one row per mode x condition (see :func:`summarize_records`;
        for completion also ``perplexity`` of the references under that mode).

    Raises:
        ValueError: invalid task, n, modes, conditions, qa_path or overrides.
    """
    modes = check_modes(modes)
    items = load_items(task, n, seed=seed, passages=index.passages, qa_path=qa_path)
    check_gold_in_index(items, index.passages)
    conditions = _check_conditions(task, conditions, items)
    config = run_config(config_overrides, TASK_MAX_NEW_TOKENS[task] if max_new_tokens is None else max_new_tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    passages_by_id = {p.id: p.text for p in index.passages}
    doc_positions = doc_positions_of(index.passages)
    warm_up(index, config, items[0])
    retrieved = {
        (item.id, condition): first_stage(index, item, condition, config.passage_k)
        for item in items
        for condition in conditions
    }

    records = []
    total = len(items) * len(conditions) * len(modes)
    with tqdm(total=total, desc=f"eval {task}", unit="gen", disable=not show_progress) as bar:
        for item in items:
            for condition in conditions:
                hits, first_stage_s = retrieved[(item.id, condition)]
                for mode in modes:
                    output, metrics = evaluate_item(
                        index, config, item, task, mode, hits, first_stage_s, passages_by_id, doc_positions
                    )
                    records.append(
                        {
                            "item_id": item.id,
                            "task": task,
                            "mode": mode,
                            "condition": condition,
                            "query": item.query,
                            "prompt": item.prompt,
                            "reference": item.reference,
                            "meta": item.meta,
                            "retrieved_ids": [p.id for p, _ in hits],
                            "output": output,
                            "metrics": metrics,
                        }
                    )
                    bar.update()

    results = summarize_records(records, task, modes, conditions)
    if task == "completion":
        scorer = eval_decoder(index, config)  # one decoder: its keys are reused across items and modes
        for row in results:
            row["perplexity"] = perplexity(
                scorer,
                items,
                mode=row["mode"],
                passages_fn=lambda item, c=row["condition"]: retrieved[(item.id, c)][0],
            )
    summary = {
        "task": task,
        "n_items": len(items),
        "seed": seed,
        "item_ids": [item.id for item in items],
        "modes": list(modes),
        "conditions": list(conditions),
        **run_metadata(index, config),
        "protocol": PROTOCOL,
        "results": results,
    }
    with (out / "items.jsonl").open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(_summary_markdown(summary), encoding="utf-8")
    logger.info("wrote %d generations and the summary of %s to %s", len(records), task, out)
    return summary
