"""NEST against in-context RAG on the integrations' own vector stores (``nest bench store``).

What a user of the README's LangChain and LlamaIndex quick starts gets, timed
question by question. For each integration :func:`run_store_bench`:

1. builds the store as the quick start does: every ``.txt`` / ``.md`` file of
   the folder, split along Markdown sections (``MarkdownSectionSplitter`` /
   ``MarkdownSectionNodeParser``, ``chunk_size`` characters), embedded into a
   ``NestVectorStore`` whose token keys are precomputed (the store's default,
   ``precompute_keys=True``; the LM encodes every chunk once here, which in the
   quick start happens when the first question binds the store);
2. saves and reloads it (``save_local`` / ``load_local``;
   ``StorageContext.persist`` / ``NestVectorStore.from_persist_dir`` and
   ``load_index_from_storage``), so the keys answering are the saved arrays,
   memory-mapped (checked and recorded);
3. answers every question twice, back to back so machine load hits both alike:
   with NEST (``ChatNest.invoke``; ``NestQueryEngine.query``, and
   ``NestChatEngine.chat`` for a follow-up) and with the README's in-context RAG
   baseline on the same store (``rag_chain(store, NestLLM(mode="base"))``;
   ``index.as_query_engine(llm=NestLLM(mode="base"))``). Wall time is the
   whole call as the user makes it (retrieval, the relevance gate, prompt
   building, generation). One untimed question (the first) warms both up.

Per question it records the wall times, both texts, whether a gold answer is
in each text (:func:`~.metrics.answer_recall`), and for NEST the output
contract's metrics (:func:`~.runner.score_item`: attribution, verbatim spans,
markup copied, repetition, cited-while-unanswerable) and time split (retrieval
with the gate, key fetching/encoding, decoding, and the time spent outside the
decoder). RAG's follow-ups are asked as their retrieval query (the earlier
questions, then the follow-up): the baselines take one question string.

The goal checked is ``NEST wall / RAG wall <= 0.5`` (:data:`WALL_RATIO_GOAL`),
the ratio of the summed wall times over the same questions.
"""

from __future__ import annotations

import logging
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from nest_integrations import LoadedLM
from .markdown_docs import FASTIFY_DOCS_DIR
from .metrics import aggregate, answer_recall
from .runner import doc_positions_of, format_cell, markdown_table, ratio, score_item, write_json
from .tasks import EvalItem, markdown_docs_items

__all__ = ["INTEGRATIONS", "README_CHUNK_SIZE", "README_MAX_NEW_TOKENS", "WALL_RATIO_GOAL", "run_store_bench"]

logger = logging.getLogger(__name__)

INTEGRATIONS: tuple[str, ...] = ("langchain", "llama_index")
README_CHUNK_SIZE = 1000
"""``chunk_size`` of the quick starts' Markdown splitters (characters)."""
README_MAX_NEW_TOKENS = 96
"""``max_new_tokens`` of the quick starts' NEST models."""
WALL_RATIO_GOAL = 0.5
"""NEST's summed wall time over the questions must be at most this share of RAG's."""
_TASK = "markdown-docs"
"""Metric set of :func:`~.runner.score_item` for documentation questions (answer recall)."""
_SUFFIXES = {".txt", ".md"}
_NEST_TIME_KEYS = ("retrieval_s", "encode_s", "decode_s", "other_decoder_s", "outside_decoder_s")
_SUMMARY_KEYS = (
    "wall_s", "answer_recall", "new_tokens", "attribution_ratio", "span_integrity", "markup_copied",
    "repetitive", "cited_unanswerable", "forward_passes", "encoded_passages", *_NEST_TIME_KEYS,
)


# --------------------------------------------------------------------------- the two integrations


def _user_and_assistant_turns(item: EvalItem) -> tuple[str, list[dict[str, str]]]:
    """The item's question and the conversation before it (empty unless it is a follow-up)."""
    if isinstance(item.prompt, str):
        return item.prompt, []
    *history, last = item.prompt
    return str(last["content"]), list(history)


def _files(folder: Path) -> list[Path]:
    """The ``.txt`` / ``.md`` files under ``folder``, sorted (the quick starts' selection)."""
    return [path for path in sorted(folder.rglob("*")) if path.is_file() and path.suffix in _SUFFIXES]


def _keys_memory_mapped(datastore: Any) -> bool:
    """Whether every precomputed key array the datastore serves is a memory map (False: none precomputed)."""
    keys = datastore.precomputed
    if keys is None:
        return False
    return all(isinstance(segment.keys, np.memmap) for segment in getattr(keys, "segments", [keys]))


def _shown_path(path: Path) -> str:
    """``path`` relative to the working directory when inside it (results name no machine's folders), else absolute."""
    resolved = path.resolve()
    return str(resolved.relative_to(Path.cwd())) if resolved.is_relative_to(Path.cwd()) else str(resolved)


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


class _LangChainStore:
    """The LangChain quick start: documents, ``MarkdownSectionSplitter``, ``NestVectorStore``,
    ``ChatNest`` and ``rag_chain(store, NestLLM(mode="base"))``."""

    name = "langchain"

    def __init__(self, lm: LoadedLM, embeddings: Any, chunk_size: int, max_new_tokens: int, rag_max_new_tokens: int, show_progress: bool):
        from nest_integrations.langchain import default_embeddings

        self.lm, self.chunk_size, self.show_progress = lm, chunk_size, show_progress
        self.max_new_tokens, self.rag_max_new_tokens = max_new_tokens, rag_max_new_tokens
        self.embeddings = embeddings if embeddings is not None else default_embeddings()

    def build(self, docs_dir: Path, folder: Path) -> dict[str, Any]:
        """Split, store, encode the keys and save to ``folder``; returns the build's counts and seconds."""
        from langchain_core.documents import Document

        from nest_integrations.langchain import MarkdownSectionSplitter, NestVectorStore

        docs = [
            Document(page_content=path.read_text(encoding="utf-8"), metadata={"source": str(path), "title": path.name})
            for path in _files(docs_dir)
        ]
        chunks = MarkdownSectionSplitter(chunk_size=self.chunk_size).split_documents(docs)
        clock = _Clock()
        store = NestVectorStore.from_documents(chunks, self.embeddings, show_progress=self.show_progress)
        embed_s = clock.lap()
        store.precompute_token_keys(self.lm)
        keys_s = clock.lap()
        store.save_local(folder, overwrite=True)
        return {"documents": len(docs), "chunks": len(chunks), "embed_s": embed_s, "encode_keys_s": keys_s, "save_s": clock.lap()}

    def load(self, folder: Path) -> int:
        """Load the saved store (keys memory-mapped) and set up NEST and RAG over it; returns its chunk count."""
        from nest_integrations.langchain import ChatNest, NestLLM, NestVectorStore, rag_chain

        self.store = NestVectorStore.load_local(folder, self.embeddings, self.lm)
        self.datastore = self.store.token_datastore(self.lm)
        self.chat = ChatNest.from_lm(self.lm, retriever=self.store, max_new_tokens=self.max_new_tokens)
        self.rag = rag_chain(self.store, NestLLM.from_lm(self.lm, mode="base", max_new_tokens=self.rag_max_new_tokens))
        return len(self.store)

    def nest(self, item: EvalItem) -> dict[str, Any]:
        """NEST's output contract for the item (``ChatNest.invoke``; a follow-up with its history)."""
        from langchain_core.messages import AIMessage, HumanMessage

        question, history = _user_and_assistant_turns(item)
        if not history:
            return dict(self.chat.invoke(question).response_metadata)
        turns = [HumanMessage(m["content"]) if m["role"] == "user" else AIMessage(m["content"]) for m in history]
        return dict(self.chat.invoke([*turns, HumanMessage(question)]).response_metadata)

    def rag_answer(self, item: EvalItem) -> str:
        """The RAG chain's answer to the item's retrieval query."""
        return str(self.rag.invoke(item.query)["answer"])


class _LlamaIndexStore:
    """The LlamaIndex quick start: ``SimpleDirectoryReader``, ``MarkdownSectionNodeParser``,
    ``NestVectorStore``, ``NestQueryEngine`` / ``NestChatEngine`` and
    ``index.as_query_engine(llm=NestLLM(mode="base"))``."""

    name = "llama_index"

    def __init__(self, lm: LoadedLM, embed_model: Any, chunk_size: int, max_new_tokens: int, rag_max_new_tokens: int, show_progress: bool):
        from nest_integrations.llama_index import default_embed_model

        self.lm, self.chunk_size, self.show_progress = lm, chunk_size, show_progress
        self.max_new_tokens, self.rag_max_new_tokens = max_new_tokens, rag_max_new_tokens
        self.embed_model = embed_model if embed_model is not None else default_embed_model()

    def build(self, docs_dir: Path, folder: Path) -> dict[str, Any]:
        """Read, split, store, encode the keys and persist to ``folder``; returns the build's counts and seconds."""
        from llama_index.core import SimpleDirectoryReader, StorageContext, VectorStoreIndex

        from nest_integrations.llama_index import MarkdownSectionNodeParser, NestVectorStore

        documents = SimpleDirectoryReader(str(docs_dir), required_exts=sorted(_SUFFIXES), recursive=True).load_data()
        clock = _Clock()
        store = NestVectorStore(show_progress=self.show_progress)
        index = VectorStoreIndex.from_documents(
            documents,
            storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=self.embed_model,
            transformations=[MarkdownSectionNodeParser(chunk_size=self.chunk_size)],
        )
        embed_s = clock.lap()
        store.precompute_token_keys(self.lm)
        keys_s = clock.lap()
        index.storage_context.persist(persist_dir=str(folder))
        chunks = len(store.get_nodes())
        return {"documents": len(documents), "chunks": chunks, "embed_s": embed_s, "encode_keys_s": keys_s, "save_s": clock.lap()}

    def load(self, folder: Path) -> int:
        """Load the persisted index (keys memory-mapped) and set up NEST and RAG over it; returns its chunk count."""
        from llama_index.core import StorageContext, load_index_from_storage

        from nest_integrations.llama_index import NestChatEngine, NestLLM, NestQueryEngine, NestVectorStore

        store = NestVectorStore.from_persist_dir(str(folder), lm=self.lm)
        self.index = load_index_from_storage(
            StorageContext.from_defaults(vector_store=store, persist_dir=str(folder)), embed_model=self.embed_model
        )
        self.datastore = store.token_datastore(self.lm)
        llm = NestLLM(self.lm, retriever=self.index, max_new_tokens=self.max_new_tokens)
        self.engine = NestQueryEngine.from_index(self.index, llm=llm)
        self.chat_engine = NestChatEngine.from_index(self.index, llm=llm)
        self.rag = self.index.as_query_engine(llm=NestLLM(self.lm, mode="base", max_new_tokens=self.rag_max_new_tokens))
        return len(store.get_nodes())

    def nest(self, item: EvalItem) -> dict[str, Any]:
        """NEST's output contract for the item (``NestQueryEngine.query``; a follow-up through
        ``NestChatEngine.chat`` with its history)."""
        from llama_index.core.llms import ChatMessage, MessageRole

        question, history = _user_and_assistant_turns(item)
        if not history:
            return dict(self.engine.query(question).metadata["nest"])
        turns = [
            ChatMessage(role=MessageRole.USER if m["role"] == "user" else MessageRole.ASSISTANT, content=m["content"])
            for m in history
        ]
        return dict(self.chat_engine.chat(question, chat_history=turns).metadata["nest"])

    def rag_answer(self, item: EvalItem) -> str:
        """The query engine's answer to the item's retrieval query."""
        return str(self.rag.query(item.query).response)


_STORES: dict[str, type] = {"langchain": _LangChainStore, "llama_index": _LlamaIndexStore}


class _Clock:
    """Seconds between successive :meth:`lap` calls (``time.perf_counter``)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        return seconds


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()`` and its wall seconds."""
    start = time.perf_counter()
    result = call()
    return result, time.perf_counter() - start


# --------------------------------------------------------------------------- one question


def _gold_recall(item: EvalItem, text: str) -> float | None:
    """:func:`~.metrics.answer_recall` of ``text``; None for a question the corpus does not answer."""
    return None if item.meta.get("unanswerable", False) else answer_recall(text, item.meta["answers"])


def _ask(
    store: Any, item: EvalItem, passages_by_id: Mapping[str, str], doc_positions: Mapping[str, tuple[str, int]]
) -> dict[str, Any]:
    """One question asked of NEST then of RAG, each timed around the whole call.

    Returns:
        ``{"id", "kind", "question", "answers", "nest": {...}, "rag": {...}, "wall_ratio"}``:
        NEST's :func:`~.runner.score_item` metrics with ``wall_s`` the measured
        call, ``decoder_wall_s`` the decoder's own, ``other_decoder_s`` the part of
        it outside retrieval, key fetching and decoding (planning the answer's
        opening, prompt formatting) and ``outside_decoder_s`` the rest of the
        call (first-stage retrieval of the engines, message conversion);
        RAG's ``wall_s``, text, ``answer_recall`` and ``new_tokens`` (the LM's
        tokens of its answer).
    """
    output, nest_wall = _timed(lambda: store.nest(item))
    rag_text, rag_wall = _timed(lambda: store.rag_answer(item))
    metrics = score_item(item, output, _TASK, passages_by_id, doc_positions=doc_positions)
    nest = {
        **metrics,
        "text": output["text"],
        "decoder_wall_s": metrics["wall_s"],
        "wall_s": nest_wall,
        "other_decoder_s": max(metrics["wall_s"] - metrics["retrieval_s"] - metrics["encode_s"] - metrics["decode_s"], 0.0),
        "outside_decoder_s": max(nest_wall - metrics["wall_s"], 0.0),
        "encoded_passages": output["stats"].get("encoded_passages", 0),
        "fallback_reason": output["stats"].get("fallback_reason"),
    }
    rag = {
        "text": rag_text,
        "wall_s": rag_wall,
        "answer_recall": _gold_recall(item, rag_text),
        "new_tokens": len(store.lm.tokenizer(rag_text, add_special_tokens=False)["input_ids"]),
    }
    question, _ = _user_and_assistant_turns(item)
    return {
        "id": item.id,
        "kind": item.meta.get("kind"),
        "question": question,
        "answers": list(item.meta.get("answers", [])),
        "nest": nest,
        "rag": rag,
        "wall_ratio": ratio(nest_wall, rag_wall),
    }


def _integration_summary(build: Mapping[str, Any], keys: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means over the questions per side, the summed-wall ratio against :data:`WALL_RATIO_GOAL`,
    the median per-question ratio, the build and the keys."""
    nest = aggregate([r["nest"] for r in rows], _SUMMARY_KEYS)
    rag = aggregate([r["rag"] for r in rows], ("wall_s", "answer_recall", "new_tokens"))
    wall_ratio = ratio(sum(r["nest"]["wall_s"] for r in rows), sum(r["rag"]["wall_s"] for r in rows))
    per_question = [r["wall_ratio"] for r in rows if r["wall_ratio"] is not None]
    return {
        "build": dict(build),
        "keys": dict(keys),
        "n": len(rows),
        "nest": nest,
        "rag": rag,
        "wall_ratio": wall_ratio,
        "median_question_wall_ratio": statistics.median(per_question) if per_question else None,
        "meets_goal": wall_ratio is not None and wall_ratio <= WALL_RATIO_GOAL,
    }


def _bench_integration(
    store: Any, docs_dir: Path, folder: Path, items: Sequence[EvalItem], *, reuse: bool, show_progress: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Build (or reuse), reload, warm up and ask every item of one integration; returns its summary and rows."""
    from tqdm.auto import tqdm

    reused = reuse and folder.is_dir() and any(folder.iterdir())
    build: dict[str, Any] = {"reused": True} if reused else {**store.build(docs_dir, folder), "reused": False}
    chunks, load_s = _timed(lambda: store.load(folder))
    build.update(chunks=chunks, load_s=load_s)
    datastore = store.datastore
    precomputed = datastore.precomputed
    keys = {
        "memory_mapped": _keys_memory_mapped(datastore),
        "tokens": precomputed.num_tokens if precomputed is not None else 0,
        "entries": precomputed.num_entries if precomputed is not None else 0,
        "saved_bytes": _folder_bytes(folder),
    }
    keys["encode_tokens_per_s"] = ratio(keys["tokens"], build.get("encode_keys_s"))
    passages = datastore.live_passages()
    passages_by_id = {p.id: p.text for p in passages}
    doc_positions = doc_positions_of(passages)
    store.nest(items[0])  # untimed warm-up of both paths: lazy imports, kernels, the embedder
    store.rag_answer(items[0])
    rows = [
        _ask(store, item, passages_by_id, doc_positions)
        for item in tqdm(items, desc=f"store bench ({store.name})", unit="question", disable=not show_progress)
    ]
    return _integration_summary(build, keys, rows), rows


# --------------------------------------------------------------------------- report


_SUMMARY_COLUMNS: tuple[str, ...] = (
    "integration", "chunks", "key tokens", "keys encoded s (tok/s)", "keys memory-mapped", "n",
    "NEST wall s", "RAG wall s", "NEST / RAG wall", f"<= {WALL_RATIO_GOAL}", "NEST recall", "RAG recall",
    "NEST tokens", "RAG tokens", "NEST attribution",
)
_SPLIT_COLUMNS: tuple[str, ...] = (
    "integration", "NEST wall s", "retrieval + gate s", "key fetch/encode s", "decode s", "other in decoder s",
    "outside decoder s", "forwards",
)
_QUESTION_COLUMNS: tuple[str, ...] = ("question", "kind", "NEST s", "RAG s", "ratio", "NEST recall", "RAG recall", "NEST tokens", "RAG tokens", "NEST forwards")


def _table(bench: Mapping[str, Any]) -> str:
    """``table.md``: the summary row per integration, NEST's time split and the per-question rows."""
    summary_rows, split_rows = [], []
    for name, result in bench["integrations"].items():
        build, keys, nest, rag = result["build"], result["keys"], result["nest"], result["rag"]
        encoded = "reused" if build["reused"] else f"{format_cell(build['encode_keys_s'])} ({format_cell(keys['encode_tokens_per_s'])})"
        summary_rows.append([
            name, build["chunks"], keys["tokens"], encoded, keys["memory_mapped"], result["n"],
            nest["wall_s"], rag["wall_s"], result["wall_ratio"], result["meets_goal"], nest["answer_recall"],
            rag["answer_recall"], nest["new_tokens"], rag["new_tokens"], nest["attribution_ratio"],
        ])
        split_rows.append([name, nest["wall_s"], *(nest[key] for key in _NEST_TIME_KEYS), nest["forward_passes"]])
    lines = [
        "# NEST against in-context RAG on the integrations' stores",
        "",
        f"- model: {bench['model']}; documents: {bench['docs_dir']}; chunk_size: {bench['chunk_size']} characters",
        f"- questions: {bench['n_items']} (seed {bench['seed']}); max_new_tokens: NEST {bench['max_new_tokens']}, "
        f"RAG {bench['rag_max_new_tokens']}; keys encoded in {bench['key_encoding_dtype']}",
        f"- date: {bench['date']}; command: `{bench['command']}`",
        "",
        markdown_table(list(_SUMMARY_COLUMNS), summary_rows),
        "",
        "Times are means per question of the whole call (one untimed question first); NEST / RAG wall is the "
        "ratio of the summed wall times. Recall: a gold answer string in the text (answerable questions only).",
        "",
        "## Where NEST's time goes (means per question)",
        "",
        markdown_table(list(_SPLIT_COLUMNS), split_rows),
        "",
    ]
    for name, rows in bench["questions"].items():
        lines += [f"## {name}: per question", ""]
        lines.append(markdown_table(list(_QUESTION_COLUMNS), [
            [r["id"], r["kind"], r["nest"]["wall_s"], r["rag"]["wall_s"], r["wall_ratio"], r["nest"]["answer_recall"],
             r["rag"]["answer_recall"], r["nest"]["new_tokens"], r["rag"]["new_tokens"], r["nest"]["forward_passes"]]
            for r in rows
        ]))
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the bench


def run_store_bench(
    *,
    out_dir: str | Path,
    lm: LoadedLM | None = None,
    docs_dir: str | Path = FASTIFY_DOCS_DIR,
    items: Sequence[EvalItem] | None = None,
    n: int | None = 12,
    seed: int = 0,
    integrations: Sequence[str] = INTEGRATIONS,
    chunk_size: int = README_CHUNK_SIZE,
    max_new_tokens: int = README_MAX_NEW_TOKENS,
    rag_max_new_tokens: int | None = None,
    embeddings: Any = None,
    embed_model: Any = None,
    store_dir: str | Path | None = None,
    reuse_stores: bool = False,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Time NEST against in-context RAG on each integration's saved store (see the module docstring).

    Args:
        out_dir: folder for ``store_bench.json`` and ``table.md`` (created if needed).
        lm: the LM (None: ``load_lm("default")``, SmolLM2-135M-Instruct).
        docs_dir: the folder of ``.txt`` / ``.md`` files (default: the bundled
            Fastify reference, the ``markdown-docs`` domain).
        items: the questions; None: ``markdown_docs_items(n, seed)`` (stratified
            by kind: how-to, follow-up, unanswerable).
        n, seed: the draw of the default questions (``n`` None: all 40).
        integrations: a subset of :data:`INTEGRATIONS`.
        chunk_size: the Markdown splitters' budget in characters (the quick starts' 1,000).
        max_new_tokens: NEST's budget (the quick starts' 96).
        rag_max_new_tokens: RAG's budget; None: the same as NEST's, so both may
            write answers of the same length (the README's LangChain baseline
            line passes 48).
        embeddings: LangChain embeddings (None: the bundled all-MiniLM-L6-v2).
        embed_model: LlamaIndex embed model (None: the bundled all-MiniLM-L6-v2).
        store_dir: where the saved stores go (``<store_dir>/<integration>``,
            replaced); None: a temporary folder removed afterwards. Saved keys
            take ``2 x hidden_size`` bytes per token (the Fastify stores' size on
            disk is in docs/results.md, Through the quick starts' stores).
        reuse_stores: load a store already saved under ``store_dir`` instead of
            building it (its build is recorded as ``reused``, without seconds);
            the questions are timed the same way.
        show_progress: progress bars (key encoding, questions).

    Returns:
        What ``store_bench.json`` holds: run facts (``command``, ``date``,
        ``model``, budgets, ``key_encoding_dtype``), ``integrations`` (per
        integration: ``build`` counts and seconds (``reused``, ``chunks``,
        ``load_s``; when built also ``documents``, ``embed_s``, ``encode_keys_s``,
        ``save_s``), ``keys`` (``memory_mapped``,
        ``tokens``, ``entries``, ``saved_bytes``, ``encode_tokens_per_s``),
        ``n``, ``nest`` and ``rag`` means, ``wall_ratio``,
        ``median_question_wall_ratio``, ``meets_goal``) and ``questions`` (per
        integration, the rows of each question).

    Raises:
        ValueError: an unknown integration, no questions, or a folder without
            ``.txt`` / ``.md`` files.
    """
    unknown = sorted(set(integrations) - set(INTEGRATIONS))
    if unknown or not integrations:
        raise ValueError(f"unknown integrations {unknown or '(none given)'}; choose from {INTEGRATIONS}")
    docs_dir = Path(docs_dir)
    if not _files(docs_dir):
        raise ValueError(f"{docs_dir} holds no .txt or .md file")
    items = list(items) if items is not None else markdown_docs_items(n, seed)
    if not items:
        raise ValueError("no questions to ask")
    if lm is None:
        from nest_integrations import load_lm

        lm = load_lm("default")
    from nest_integrations.store.key_precision import encoding_dtype

    rag_budget = max_new_tokens if rag_max_new_tokens is None else rag_max_new_tokens
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nest-store-bench-") as scratch:
        stores = Path(store_dir) if store_dir is not None else Path(scratch)
        results, questions = {}, {}
        for name in integrations:
            side = embeddings if name == "langchain" else embed_model
            store = _STORES[name](lm, side, chunk_size, max_new_tokens, rag_budget, show_progress)
            results[name], questions[name] = _bench_integration(
                store, docs_dir, stores / name, items, reuse=reuse_stores and store_dir is not None, show_progress=show_progress
            )
            logger.info("%s: NEST / RAG wall %s over %d questions", name, format_cell(results[name]["wall_ratio"]), len(items))
    bench = {
        "command": shlex.join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": lm.name,
        "docs_dir": _shown_path(docs_dir),
        "chunk_size": chunk_size,
        "n_items": len(items),
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "rag_max_new_tokens": rag_budget,
        "key_encoding_dtype": str(encoding_dtype(lm)).removeprefix("torch."),
        "wall_ratio_goal": WALL_RATIO_GOAL,
        "integrations": results,
        "questions": questions,
    }
    write_json(out / "store_bench.json", bench)
    (out / "table.md").write_text(_table(bench), encoding="utf-8")
    logger.info("wrote the store benchmark to %s", out)
    return bench
