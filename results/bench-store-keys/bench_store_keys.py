"""Lazy against precomputed token keys in the LangChain NestVectorStore, on a realistic store.

The store: ``--corpus wiki``, ``--docs`` Wikipedia summaries of people (the
bundled corpus), or ``--corpus docs``, the standard-library documentation of
``nest eval --task docs`` (:func:`nest_benchmarks.docs_corpus.docs_corpus`),
split by LangChain's RecursiveCharacterTextSplitter at its default 4,000-character
chunks, embedded by the bundled all-MiniLM-L6-v2, keyed by the default LM. Measured:

* seconds to add the documents, lazy (embedding only) and precomputing keys;
* seconds per NEST answer (wiki: "Tell me a bio of <name>.", retrieval query the
  name; docs: the first questions of ``docs_qa.jsonl``, one per module), each
  question asked of every store in turn so machine load hits them alike; lazy
  answers encode the chunks no earlier answer retrieved;
* save_local and load_local (keys memory-mapped) seconds, and the reloaded
  store's answers;
* whether the three stores' answers are identical item by item.

Run from the repository root:
``.venv/bin/python results/bench-store-keys/bench_store_keys.py --corpus docs --out results/bench-store-keys/docs``
(the run ``docs/persistence.md`` cites)
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path
from typing import Any

from langchain_core.documents import Document
from langchain_text_splitters import RecursiveCharacterTextSplitter

from nest_benchmarks.docs_corpus import docs_corpus
from nest_benchmarks.runner import markdown_table, write_json
from nest_integrations import Passage, load_lm, load_wikipedia_summaries
from nest_integrations.langchain import NestLLM, NestVectorStore, default_embeddings


CORPUS_NAMES = {"wiki": "Wikipedia summaries of people", "docs": "standard-library modules' documentation"}
QUESTION_NAMES = {"wiki": '"Tell me a bio of <name>."', "docs": "docs_qa.jsonl, the first of each module"}


def _answer(store: NestVectorStore, lm: Any, question: tuple[str, str], max_new_tokens: int) -> dict[str, Any]:
    """One NEST answer to ``(prompt, retrieval query)`` from ``store``: its text and the stats of the output contract."""
    llm = NestLLM.from_lm(lm, retriever=store, max_new_tokens=max_new_tokens)
    start = time.perf_counter()
    generation = llm.generate([question[0]], query=question[1]).generations[0][0]
    wall = time.perf_counter() - start
    stats = generation.generation_info["stats"]
    return {"text": generation.text, "wall_s": wall, "encode_s": stats["encode_s"], "encode_passes": stats["encode_passes"]}


def corpus_and_questions(corpus: str, docs: int, questions: int) -> tuple[list[Passage], list[tuple[str, str]]]:
    """Whole documents and ``(prompt, retrieval query)`` pairs."""
    if corpus == "wiki":
        passages = load_wikipedia_summaries(topic="People", limit=docs)
        return passages, [(f"Tell me a bio of {p.title}.", p.title) for p in passages[:questions]]
    passages = docs_corpus()
    items = [json.loads(line) for line in (files("nest_benchmarks") / "data" / "docs_qa.jsonl").read_text().splitlines()]
    first_per_module = list({item["doc_id"]: item for item in reversed(items)}.values())[::-1]
    return passages, [(item["question"], item["question"]) for item in first_per_module[:questions]]


def run(corpus: str, docs: int, questions: int, max_new_tokens: int) -> dict[str, Any]:
    lm = load_lm()
    embeddings = default_embeddings()
    passages, names = corpus_and_questions(corpus, docs, questions)
    splitter = RecursiveCharacterTextSplitter(add_start_index=True)
    chunks = splitter.split_documents(
        [Document(page_content=p.text, metadata={"title": p.title, "source": p.id}) for p in passages]
    )
    embeddings.embed_documents([c.page_content for c in chunks[:4]])  # load the embedder outside the timings
    _answer(NestVectorStore.from_documents(chunks[:2], embeddings, lm=lm), lm, names[0], 8)  # warm-up, untimed

    start = time.perf_counter()
    lazy = NestVectorStore.from_documents(chunks, embeddings, lm=lm, precompute_keys=False)
    add_lazy = time.perf_counter() - start
    start = time.perf_counter()
    pre = NestVectorStore.from_documents(chunks, embeddings, lm=lm, precompute_keys=True)
    add_pre = time.perf_counter() - start
    datastore = pre.token_datastore()
    tokens = datastore.precomputed.num_tokens

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        pre.save_local(Path(tmp) / "store")
        save_s = time.perf_counter() - start
        start = time.perf_counter()
        loaded = NestVectorStore.load_local(Path(tmp) / "store", embeddings, lm=lm)
        load_s = time.perf_counter() - start
        answers: dict[str, list[dict[str, Any]]] = {"lazy": [], "precomputed": [], "reloaded": []}
        for name in names:
            for kind, store in (("lazy", lazy), ("precomputed", pre), ("reloaded", loaded)):
                answers[kind].append(_answer(store, lm, name, max_new_tokens))

    def summary(kind: str) -> dict[str, Any]:
        walls = [a["wall_s"] for a in answers[kind]]
        return {
            "answer_s_mean": statistics.mean(walls),
            "answer_s_median": statistics.median(walls),
            "answer_s_max": max(walls),
            "first_answer_s": walls[0],
            "encode_s_total": sum(a["encode_s"] for a in answers[kind]),
        }

    identical = [a["text"] == b["text"] == c["text"] for a, b, c in zip(*answers.values())]
    return {
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": lm.name,
        "corpus": corpus,
        "documents": len(passages),
        "chunks": len(chunks),
        "chunk_chars_mean": statistics.mean(len(c.page_content) for c in chunks),
        "tokens": tokens,
        "questions": len(names),
        "max_new_tokens": max_new_tokens,
        "add_s": {"lazy": add_lazy, "precomputed": add_pre},
        "precompute_tokens_per_s": tokens / max(add_pre - add_lazy, 1e-9),
        "save_s": save_s,
        "load_s": load_s,
        "answers": {kind: summary(kind) for kind in answers},
        "identical_outputs": f"{sum(identical)}/{len(identical)}",
        "items": [{"prompt": n[0], **{k: answers[k][i] for k in answers}} for i, n in enumerate(names)],
    }


def markdown(report: dict[str, Any]) -> str:
    rows = [
        [kind, report["add_s"].get(kind, report["add_s"]["precomputed"]) if kind != "reloaded" else report["load_s"],
         s["first_answer_s"], s["answer_s_mean"], s["answer_s_median"], s["answer_s_max"], s["encode_s_total"]]
        for kind, s in report["answers"].items()
    ]
    table = markdown_table(
        ["keys", "add (or load) s", "first answer s", "mean answer s", "median answer s", "max answer s", "encode s, all answers"], rows
    )
    return "\n".join([
        "# NestVectorStore: lazy against precomputed token keys",
        "",
        f"- model: {report['model']}; {report['documents']} {CORPUS_NAMES[report['corpus']]}, {report['chunks']} chunks "
        f"(RecursiveCharacterTextSplitter defaults, mean {report['chunk_chars_mean']:.0f} characters), {report['tokens']} tokens",
        f"- {report['questions']} questions ({QUESTION_NAMES[report['corpus']]}), NEST, max_new_tokens {report['max_new_tokens']}; "
        "each asked of the three stores in turn",
        f"- precomputing: {report['precompute_tokens_per_s']:.0f} tokens/s; save_local {report['save_s']:.2f} s, "
        f"load_local (keys memory-mapped) {report['load_s']:.2f} s",
        f"- identical outputs (lazy = precomputed = reloaded): {report['identical_outputs']}",
        f"- date: {report['date']}; command: `{report['command']}`",
        "",
        table,
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", choices=sorted(CORPUS_NAMES), default="wiki")
    parser.add_argument("--docs", type=int, default=40, help="Wikipedia summaries (--corpus wiki)")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = run(args.corpus, args.docs, args.questions, args.max_new_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "bench.json", report)
    (args.out / "bench.md").write_text(markdown(report), encoding="utf-8")
    print(json.dumps({k: report[k] for k in ("add_s", "answers", "identical_outputs")}, indent=2))


if __name__ == "__main__":
    main()
