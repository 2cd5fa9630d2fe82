"""Scaling benchmark (``nest bench scale``): memory, build time and latency against corpus size.

The bundled corpus has 10,033 Wikipedia summaries; larger corpora are made
by **duplicating** it, passages and embeddings alike. Copy 0 is the corpus
itself; copy ``c >= 1`` of a passage gets the id ``"<id>~<c>"``, the same text,
and the passage's embedding plus Gaussian noise of norm ~``noise``,
re-normalised, so the index holds distinct vectors (exact duplicates would
make IVF lists and HNSW graphs degenerate) and recall against the flat index
stays measurable. The corpus is embedded once; duplicates are not
re-embedded (that would cost hours and measure nothing new), so the
embedding time of a size is *extrapolated* from the measured rate.

For each size and each first stage (flat, IVF, HNSW; HNSW only up to
``hnsw_max`` passages, its build being the slowest) in one run:

* build: seconds to index the given embeddings (training included) and the
  index's bytes (:func:`~nest_integrations.retrieval.faiss_index.index_bytes`);
* query: mean milliseconds of one top-``k`` search (query embedding excluded,
  one query per call, as a generation makes, on one FAISS thread) and recall@k against flat;
* NEST: per-token latency of ``nest`` generations on a few biography prompts,
  each over a fresh lazy datastore (every retrieved passage encoded inside
  the generation), dense retrieval only: the corpus size then only acts
  through the first stage. BM25/hybrid is left out (a 1M-document BM25
  index is its own memory story).

Per size also the token datastore that precomputed keys would need:
``tokens x (2 * hidden_size + 13)`` bytes (float16 key, int32 token id, two
int32 character offsets, a bool validity flag), tokens counted with the LM's
tokenizer on the corpus; and the compressed-key target of
:data:`COMPRESSED_KEY_BYTES` per token (a target, not measured here).

:func:`extrapolate` turns the measured figures into the paper's 33M
passages under :data:`ASSUMPTIONS`, written into the JSON too.
Outputs: ``scale.json``, ``scale.md`` and ``scale.png`` in ``out_dir``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import resource
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from nest_integrations import NestConfig, Passage
from nest_integrations.core.similarity import unit_rows
from nest_integrations.retrieval.base import index_text
from nest_integrations.retrieval.dense import DenseRetriever, embed_texts, resolve_embedder
from .runner import decoder_over, fresh_lazy_datastore, load_items, markdown_table, ratio, write_json

__all__ = ["ASSUMPTIONS", "COMPRESSED_KEY_BYTES", "DEFAULT_SIZES", "PAPER_PASSAGES", "extrapolate", "run_scale_bench"]

logger = logging.getLogger(__name__)

DEFAULT_SIZES: tuple[int, ...] = (10_000, 30_000, 100_000, 300_000, 1_000_000)
SCALE_INDEXES: tuple[str, ...] = ("flat", "ivf", "hnsw")
PAPER_PASSAGES = 33_000_000
"""Passages of the paper's Wikipedia datastore."""
COMPRESSED_KEY_BYTES = 144
"""Target bytes per token of compressed keys (1/8 of float16 keys of the default LM); a target, not a measurement."""
PQ_BYTES = 48
"""Bytes per passage code of the IVF-PQ first stage assumed for 33M passages (IVF65536,PQ48: 384-d in 48 sub-quantisers)."""
PAPER_NLIST = 65_536
_ENTRY_EXTRA_BYTES = 13
"""Per-token bytes of a precomputed datastore besides the key: int32 token id, two int32 offsets, a bool."""


# --------------------------------------------------------------------------- corpus at size n
def duplicated(passages: Sequence[Passage], vectors: np.ndarray, n: int, *, noise: float, seed: int) -> tuple[list[Passage], np.ndarray]:
    """The first ``n`` passages of the corpus repeated (module docstring) and their float32 (n, d) unit vectors."""
    assert vectors.dtype == np.float32 and vectors.shape[0] == len(passages), (vectors.dtype, vectors.shape)
    base, dim = vectors.shape
    copies = -(-n // base)
    out = np.empty((n, dim), dtype=np.float32)
    rng = np.random.default_rng(seed)
    for c in range(copies):
        rows = slice(c * base, min(n, (c + 1) * base))
        count = rows.stop - rows.start
        block = vectors[:count]
        if c:
            block = unit_rows(block + rng.standard_normal((count, dim), dtype=np.float32) * np.float32(noise / math.sqrt(dim)))
        out[rows] = block
    corpus = [
        p if i < base else Passage(id=f"{p.id}~{i // base}", text=p.text, title=p.title, metadata=p.metadata)
        for i, p in ((i, passages[i % base]) for i in range(n))
    ]
    return corpus, out


def corpus_embeddings(
    embedder: Any, embedder_name: str, passages: Sequence[Passage], cache: Optional[Path]
) -> tuple[np.ndarray, float, bool]:
    """Float32 (n, d) unit embeddings of ``passages`` by ``embedder``, the passages/s they were
    embedded at, and whether they came from ``cache`` (a folder; None: no caching).

    Cached files are named by the sha256 of the embedder's name and every passage's indexed
    text, so another corpus or embedder never reads them; re-embedding the summaries is the
    slow part of a run (docs/scale.md has the rate), and the rate measured then is kept beside them.
    """
    texts = [index_text(p) for p in passages]
    digest = hashlib.sha256(embedder_name.encode("utf-8") + b"\0")
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    stem = cache / f"embeddings-{digest.hexdigest()[:24]}" if cache is not None else None
    if stem is not None and stem.with_suffix(".npy").is_file() and stem.with_suffix(".json").is_file():
        vectors = np.load(stem.with_suffix(".npy"), allow_pickle=False)
        rate = json.loads(stem.with_suffix(".json").read_text())["passages_per_s"]
        if vectors.dtype == np.float32 and vectors.shape[0] == len(texts):
            return np.ascontiguousarray(vectors), float(rate), True
    start = time.perf_counter()
    vectors = embed_texts(embedder, texts)
    rate = len(texts) / (time.perf_counter() - start)
    if stem is not None:
        stem.parent.mkdir(parents=True, exist_ok=True)
        np.save(stem.with_suffix(".npy"), vectors, allow_pickle=False)
        stem.with_suffix(".json").write_text(json.dumps({"passages_per_s": rate}))
    return vectors, rate, False


# --------------------------------------------------------------------------- measurements
def _query_ms(dense: DenseRetriever, queries: np.ndarray, k: int) -> tuple[float, np.ndarray]:
    """Mean milliseconds of one top-``k`` search per query (one call each) and the (q, k) labels."""
    labels = np.empty((len(queries), k), dtype=np.int64)
    start = time.perf_counter()
    for row in range(len(queries)):
        labels[row] = dense.search_vectors(queries[row : row + 1], k)[1][0]
    return (time.perf_counter() - start) * 1e3 / len(queries), labels


def _recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of each exact top-k row also in the found row."""
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found, exact)]))


def _nest_latency(dense: DenseRetriever, lm: Any, items: Sequence[Any], config: NestConfig) -> dict[str, Any]:
    """Sums over ``nest`` generations of ``items``, each over a fresh lazy datastore."""
    from nest_integrations import NestIndex

    index = NestIndex(lm, dense.passages, dense, retriever_kind="dense")
    totals = {"new_tokens": 0, "wall_s": 0.0, "retrieval_s": 0.0, "encode_s": 0.0, "encoded_passages": 0}
    for item in items:
        stats = decoder_over(index, fresh_lazy_datastore(index), config).generate(item.prompt, query=item.query).stats
        for key in totals:
            totals[key] += getattr(stats, key)
    generations = len(items)
    return {
        **totals,
        "generations": generations,
        "ms_per_token": ratio(1e3 * totals["wall_s"], totals["new_tokens"]),
        "first_stage_ms_per_generation": 1e3 * totals["retrieval_s"] / generations,
        "encode_s_per_generation": totals["encode_s"] / generations,
    }


@contextmanager
def _faiss_threads(count: int) -> Iterator[None]:
    """FAISS's OpenMP threads set to ``count`` inside the block. Searches are timed on one
    thread: on a shared machine, spinning OpenMP threads made a single search many times
    slower (docs/scale.md, Scaling measured). Builds keep every thread."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(count)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def _measure_index(
    kind: str, passages: list[Passage], vectors: np.ndarray, embedder: Any, queries: np.ndarray, exact: Optional[np.ndarray],
    *, k: int, lm: Any, items: Sequence[Any], config: NestConfig,
) -> tuple[dict[str, Any], np.ndarray]:
    """One first stage at one size: build, memory, query latency, recall vs ``exact`` (None: this is flat), NEST."""
    start = time.perf_counter()
    dense = DenseRetriever.from_vectors(passages, vectors, embedder, index_factory=kind, show_progress=False)
    build_s = time.perf_counter() - start
    with _faiss_threads(1):
        query_ms, labels = _query_ms(dense, queries, k)
        nest = _nest_latency(dense, lm, items, config) if items else None
    row = {
        "index": kind,
        "factory": dense.index_factory,
        "build_s": build_s,
        "index_mib": dense.index_nbytes() / 2**20,
        "query_ms": query_ms,
        "recall_at_k": 1.0 if exact is None else _recall(labels, exact),
        "nest": nest,
    }
    logger.info("n=%d %s: build %.1f s, %.2f ms/query", len(passages), kind, build_s, query_ms)
    return row, labels


def _tokens_per_passage(lm: Any, passages: Sequence[Passage]) -> float:
    """Mean LM tokens per passage text (what a precomputed datastore stores per passage)."""
    counts = lm.tokenizer([p.text for p in passages], add_special_tokens=False)["input_ids"]
    return float(np.mean([len(ids) for ids in counts]))


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux


# --------------------------------------------------------------------------- the run
def run_scale_bench(
    *,
    out_dir: str | Path,
    sizes: Sequence[int] = DEFAULT_SIZES,
    indexes: Sequence[str] = SCALE_INDEXES,
    hnsw_max: int = 100_000,
    queries: int = 20,
    prompts: int = 3,
    max_new_tokens: int = 32,
    noise: float = 0.05,
    seed: int = 0,
    passages: Optional[Sequence[Passage]] = None,
    lm: Any = None,
    embedder: Any = None,
    embeddings_cache: Optional[Path] = None,
) -> dict[str, Any]:
    """Measure the first stage and NEST at each corpus size (module docstring); write json, md and png.

    Args:
        sizes: corpus sizes, increasing; the corpus is duplicated to reach them.
        indexes: first stages to measure among "flat", "ivf", "hnsw"; flat is
            always measured (it is recall's reference).
        hnsw_max: largest size HNSW is built for.
        queries: retrieval queries (titles of random corpus passages) for latency and recall.
        prompts: biography prompts per NEST measurement (0: no NEST runs).
        noise: norm of the noise added to duplicated embeddings.
        passages, lm, embedder: the corpus (default: the 10,033 summaries), the
            LM (default model) and the sentence embedder (bundled MiniLM).
        embeddings_cache: folder keeping the corpus embeddings between runs
            (:func:`corpus_embeddings`); None embeds every run.

    Raises:
        ValueError: empty or non-increasing sizes, an unknown index, too few
            queries/prompts for the corpus.
    """
    from nest_integrations import load_lm, load_wikipedia_summaries

    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 1 for s in sizes) or sizes != sorted(set(sizes)):
        raise ValueError(f"sizes must be positive and strictly increasing, got {sizes}")
    unknown = sorted(set(indexes) - set(SCALE_INDEXES))
    if unknown:
        raise ValueError(f"unknown index kind(s) {unknown}; choose from {SCALE_INDEXES}")
    kinds = ["flat", *[k for k in SCALE_INDEXES if k in indexes and k != "flat"]]
    base = list(passages) if passages is not None else load_wikipedia_summaries()
    if not 1 <= queries <= len(base) or prompts < 0:
        raise ValueError(f"queries must be in [1, {len(base)}] and prompts >= 0")
    lm = lm if lm is not None else load_lm()
    config = NestConfig(mode="nest", max_new_tokens=max_new_tokens)
    k = config.passage_k

    embedder, embedder_name, _ = resolve_embedder(embedder)
    vectors, embed_rate, from_cache = corpus_embeddings(embedder, embedder_name, base, embeddings_cache)
    rng = np.random.default_rng(seed)
    query_texts = [base[i].title or base[i].text[:80] for i in rng.choice(len(base), size=queries, replace=False)]
    query_vectors = embed_texts(embedder, query_texts)
    items = load_items("bio", prompts, seed=seed, passages=base) if prompts else []
    tokens_per_passage = _tokens_per_passage(lm, base)
    bytes_per_token = 2 * int(lm.model.config.hidden_size) + _ENTRY_EXTRA_BYTES
    if items:  # untimed: loads kernels and the embedder's weights before anything is timed
        _nest_latency(DenseRetriever.from_vectors(base, vectors, embedder, index_factory="flat"), lm, items[:1], config.updated(max_new_tokens=2))

    rows = []
    for n in sizes:
        corpus, corpus_vectors = duplicated(base, vectors, n, noise=noise, seed=seed)
        exact = None
        for kind in kinds:
            if kind == "hnsw" and n > hnsw_max:
                continue
            row, labels = _measure_index(kind, corpus, corpus_vectors, embedder, query_vectors, exact, k=min(k, n), lm=lm, items=items, config=config)
            exact = labels if kind == "flat" else exact
            rows.append({
                "n": n,
                "copies": -(-n // len(base)),
                "embeddings_mib": corpus_vectors.nbytes / 2**20,
                "embed_s_extrapolated": n / embed_rate,
                "tokens": n * tokens_per_passage,
                "keys_float16_mib": n * tokens_per_passage * bytes_per_token / 2**20,
                "keys_target_mib": n * tokens_per_passage * COMPRESSED_KEY_BYTES / 2**20,
                **row,
            })
        del corpus, corpus_vectors

    result = {
        "corpus": f"{len(base)} Wikipedia summaries, duplicated to each size (duplicates not re-embedded; noise {noise})",
        "sizes": sizes,
        "indexes": kinds,
        "hnsw_max": hnsw_max,
        "k": k,
        "queries": queries,
        "prompts": [item.prompt for item in items],
        "max_new_tokens": max_new_tokens,
        "model": lm.name,
        "embed_passages_per_s": embed_rate,
        "embeddings_from_cache": from_cache,
        "tokens_per_passage": tokens_per_passage,
        "precomputed_bytes_per_token": bytes_per_token,
        "peak_rss_mib": _peak_rss_mib(),
        "rows": rows,
    }
    result["extrapolation"] = extrapolate(result)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "scale.json", result)
    (out / "scale.md").write_text(scale_markdown(result), encoding="utf-8")
    plot_scale(result, out / "scale.png")
    return result


# --------------------------------------------------------------------------- extrapolation
def _largest(result: dict[str, Any], kind: str) -> Optional[dict[str, Any]]:
    rows = [r for r in result["rows"] if r["index"] == kind]
    return rows[-1] if rows else None


ASSUMPTIONS: tuple[str, ...] = (
    "passages as long as the summaries (the measured tokens per passage)",
    "embeddings: 384-d float32 (MiniLM), embedded at the measured rate on this machine's 2 cores, linear in passages",
    f"first stage: IVF{PAPER_NLIST},PQ{PQ_BYTES} ({PQ_BYTES} B code + 8 B id per passage, plus {PAPER_NLIST:,} "
    "float32 centroids), since flat or IVF-flat would need every embedding in RAM",
    "first-stage build: the IVF build seconds per passage measured at the largest IVF size, times the ratio of "
    f"nlist ({PAPER_NLIST:,} / measured), as assignment to centroids dominates; PQ encoding not included",
    "first-stage query: flat latency linear in passages (the measured ms per passage at the largest flat size); "
    f"IVF-PQ scans nprobe/nlist = 256/{PAPER_NLIST:,} of the codes at flat's per-byte rate (optimistic: PQ "
    "distance tables cost more per byte than a dot product)",
    "token keys: precomputed at float16 (2 x hidden + 13 B per token) and at the compressed target of "
    f"{COMPRESSED_KEY_BYTES} B per token (a target, not measured)",
    "NEST per-token latency: the measured per-token latency at the largest flat size minus its first-stage share, "
    "plus the extrapolated first-stage query spread over the tokens of one generation",
)
"""What :func:`extrapolate` assumes (also written into its output)."""


def extrapolate(result: dict[str, Any], passages: int = PAPER_PASSAGES) -> dict[str, Any]:
    """The figures of a :func:`run_scale_bench` result carried to ``passages`` (default the paper's 33M)
    under :data:`ASSUMPTIONS`. Sizes in GiB, times in hours or milliseconds."""
    tokens = passages * result["tokens_per_passage"]
    flat, ivf = _largest(result, "flat"), _largest(result, "ivf")
    gib = 2**30
    nprobe = 256
    out: dict[str, Any] = {
        "passages": passages,
        "tokens": tokens,
        "embeddings_gib": passages * 384 * 4 / gib,
        "embed_hours_2_cores": passages / result["embed_passages_per_s"] / 3600,
        "ivfpq_gib": (passages * (PQ_BYTES + 8) + PAPER_NLIST * 384 * 4) / gib,
        "keys_float16_gib": tokens * result["precomputed_bytes_per_token"] / gib,
        "keys_target_gib": tokens * COMPRESSED_KEY_BYTES / gib,
    }
    if flat is not None:
        per_passage_ms = flat["query_ms"] / flat["n"]
        out["flat_query_ms"] = per_passage_ms * passages
        out["ivfpq_query_ms"] = per_passage_ms * passages * nprobe / PAPER_NLIST * PQ_BYTES / (384 * 4)
        if flat.get("nest"):
            nest = flat["nest"]
            tokens_per_generation = nest["new_tokens"] / nest["generations"]
            size_free_ms = nest["ms_per_token"] - nest["first_stage_ms_per_generation"] / tokens_per_generation
            out["nest_ms_per_token_ivfpq"] = size_free_ms + out["ivfpq_query_ms"] / tokens_per_generation
            out["nest_ms_per_token_flat"] = size_free_ms + out["flat_query_ms"] / tokens_per_generation
    if ivf is not None:
        nlist = int(ivf["factory"].split(",")[0][3:])
        out["ivf_build_hours_2_cores"] = ivf["build_s"] / ivf["n"] * passages * PAPER_NLIST / nlist / 3600
    out["assumptions"] = list(ASSUMPTIONS)
    return out


# --------------------------------------------------------------------------- report
_COLUMNS = [
    ("n", "passages"), ("copies", "copies"), ("index", "first stage"), ("factory", "FAISS"), ("build_s", "build s"),
    ("index_mib", "index MiB"), ("query_ms", "query ms"), ("recall_at_k", "recall@k"), ("nest_ms", "NEST ms/token"),
    ("first_ms", "of which 1st stage ms/gen"), ("encode_s", "lazy encode s/gen"), ("keys_float16_mib", "keys f16 MiB"),
    ("keys_target_mib", "keys 144 B/tok MiB"), ("embed_s_extrapolated", "embed s (extrapolated)"),
]


def _cells(row: dict[str, Any]) -> list[Any]:
    nest = row.get("nest") or {}
    values = {
        **row,
        "nest_ms": nest.get("ms_per_token"),
        "first_ms": nest.get("first_stage_ms_per_generation"),
        "encode_s": nest.get("encode_s_per_generation"),
    }
    return [values.get(key) for key, _ in _COLUMNS]


def scale_markdown(result: dict[str, Any]) -> str:
    """``scale.md``: what was run, one row per size x first stage, and the 33M extrapolation."""
    ex = result["extrapolation"]
    lines = [
        f"Corpus: {result['corpus']}. Model {result['model']}; {len(result['prompts'])} bio prompts x "
        f"{result['max_new_tokens']} tokens per NEST cell (dense first stage, fresh lazy datastore per prompt); "
        f"{result['queries']} queries, k={result['k']}. Embedding rate {result['embed_passages_per_s']:.0f} passages/s "
        f"(embed s at larger sizes extrapolated: duplicates are not re-embedded). {result['tokens_per_passage']:.0f} tokens "
        f"per passage, {result['precomputed_bytes_per_token']} B per precomputed token. Peak RSS "
        f"{result['peak_rss_mib']:.0f} MiB.",
        "",
        markdown_table([header for _, header in _COLUMNS], [_cells(row) for row in result["rows"]]),
        "",
        f"Extrapolated to {ex['passages']:,} passages ({ex['tokens']:.3g} tokens):",
        "",
        markdown_table(
            ["quantity", "value"],
            [[key, value] for key, value in ex.items() if key not in ("passages", "tokens", "assumptions")],
        ),
        "",
        "Assumptions: " + " ".join(f"({i}) {a}" for i, a in enumerate(ex["assumptions"], 1)),
    ]
    return "\n".join(lines) + "\n"


def plot_scale(result: dict[str, Any], path: Path) -> None:
    """Four log-log panels against corpus size: memory, build time, query latency, NEST ms/token."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("the scale plot needs matplotlib: pip install 'nest-integrations[eval]'") from err
    panels = [
        ("index_mib", "memory (MiB)"), ("build_s", "first-stage build (s)"),
        ("query_ms", "first-stage query (ms)"), ("nest_ms", "NEST latency (ms/token)"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, (key, title) in zip(axes.flat, panels):
        for kind in result["indexes"]:
            rows = [r for r in result["rows"] if r["index"] == kind]
            ys = [(r.get("nest") or {}).get("ms_per_token") if key == "nest_ms" else r[key] for r in rows]
            points = [(r["n"], y) for r, y in zip(rows, ys) if y]
            if points:
                ax.plot(*zip(*points), marker="o", label=kind)
        if key == "index_mib":
            flat = [r for r in result["rows"] if r["index"] == "flat"]
            ax.plot([r["n"] for r in flat], [r["keys_float16_mib"] for r in flat], "k--", label="token keys f16")
            ax.plot([r["n"] for r in flat], [r["keys_target_mib"] for r in flat], "k:", label="token keys 144 B (target)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("passages")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("NEST first stage vs corpus size (duplicated Wikipedia summaries, 2 CPU cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
