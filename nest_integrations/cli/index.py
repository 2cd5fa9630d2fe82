"""``nest index build | info | to-qdrant``, ``nest retrieve`` and ``nest calibrate``: making,
inspecting and querying indexes."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from nest_integrations.corpus.chunking import DEFAULT_CHUNK_TOKENS
from nest_integrations.index.distributed import DEFAULT_CONNECT_TIMEOUT_S
from nest_integrations.store.key_codec import CODEC_HELP
from .common import console, fail, given, load_index, positive, setup_logging

index_app = typer.Typer(help="Build and inspect NEST indexes.", no_args_is_help=True)
app = typer.Typer()
"""The top-level commands of this module (``retrieve``, ``calibrate``), merged into ``nest``."""

@index_app.command("build")
def index_build(
    ctx: typer.Context,
    source: str = typer.Argument(
        ..., help="A .txt, .md, .rst or .jsonl file, a folder of them, or 'wiki' (the bundled Wikipedia summaries)."
    ),
    out: Path = typer.Option(..., "--out", help="Index folder to write (new, empty, or an index with --force)."),
    force: bool = typer.Option(False, "--force", help="Replace an index already at --out; never anything else."),
    limit: Optional[int] = typer.Option(None, min=1, help="Keep at most this many passages."),
    topic: Optional[str] = typer.Option(None, help="Wikipedia topic filter, e.g. People (source 'wiki' only)."),
    max_tokens: int = typer.Option(
        DEFAULT_CHUNK_TOKENS, min=0, help="Chunk documents into passages of at most this many LM tokens (whole sentences), so every passage "
        "stays retrievable and fits the datastore; 0: one passage per document.",
    ),
    max_words: Optional[int] = typer.Option(None, min=1, help="Chunk by words instead of tokens."),
    precompute_keys: bool = typer.Option(
        True, "--precompute-keys/--lazy-keys",
        help="Encode every token key now (build time ~ corpus tokens / 600 per second on 2 CPU cores, "
        "1,152 bytes per token on the default LM), so generation never waits for passage encoding; "
        "--lazy-keys encodes passages the first time they are retrieved.",
    ),
    key_compression: str = typer.Option(
        "none", help=f"Store precomputed keys as {CODEC_HELP}; none keeps float16 (1,152 B/token on the default LM). "
        "A codec is trained on a sample of the first passages encoded; docs/compression.md has the measured "
        "trade-off (bytes, neighbour agreement, attribution, speed).",
    ),
    model: str = typer.Option("default", help="LM: 'default', a hub id or a local path."),
    retriever: str = typer.Option("hybrid", help="First stage: hybrid, dense or bm25."),
    index_factory: str = typer.Option(
        "auto", "--faiss-index", "--index-factory",
        help="Dense first stage: auto (flat below 100k passages, IVF above), flat (exact), ivf, hnsw, "
        "or a FAISS factory string (e.g. IVF4096,PQ32).",
    ),
    nlist: Optional[int] = typer.Option(None, min=1, help="IVF lists (default 4*sqrt(passages)); at most the passages."),
    nprobe: Optional[int] = typer.Option(None, min=1, help="IVF lists probed per query (default sqrt(nlist)): recall vs latency."),
    hnsw_m: int = typer.Option(32, min=2, help="HNSW links per node: recall and memory vs build time."),
    ef_search: Optional[int] = typer.Option(None, min=1, help="HNSW candidates per query (default 16): recall vs latency."),
    faiss_on_disk: bool = typer.Option(
        False, "--faiss-on-disk", help="Memory-map the FAISS index when the index is loaded instead of reading it into memory."
    ),
    key_layer: str = typer.Option("ffn_input", help="Key layer: ffn_input or layer:<i>."),
    encoding_prefix: str = typer.Option("auto", help="Encoding prefix: auto, chat, '' (bare) or literal text."),
    use_ray: bool = typer.Option(
        False, "--ray", help="Embed passages and encode keys on Ray workers (one LM and embedder each), written as key shards; "
        "joins $RAY_ADDRESS or a cluster started here with `ray start`, else starts a local one. Needs the 'ray' extra.",
    ),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster HOST:PORT to build on (implies --ray)."),
    workers: Optional[int] = typer.Option(None, min=1, help="Ray workers (default: cluster CPUs / --cpus-per-worker)."),
    cpus_per_worker: float = typer.Option(1.0, callback=positive, help="CPUs each Ray worker reserves (its torch threads)."),
    shard_passages: int = typer.Option(256, min=1, help="Passages per key shard and per Ray task."),
    ray_timeout: float = typer.Option(
        DEFAULT_CONNECT_TIMEOUT_S, callback=positive, help="Seconds a Ray cluster at --ray-address may take to answer before the command fails.",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Build a NEST index (passages, dense + BM25 retrieval, token datastore)."""
    from nest_integrations.core.safe_io import check_replaceable
    from nest_integrations.corpus.chunking import chunk_passages
    from nest_integrations.corpus.loaders import TEXT_SUFFIXES, left_out_files, load_corpus
    from nest_integrations.index.index_folder import FORMAT as INDEX_FORMAT
    from nest_integrations.index.nest_index import NestIndex
    from nest_integrations.model.lm import load_lm
    from nest_integrations.store.key_codec import parse_spec

    if verbose:  # else keep what `nest -v` set
        setup_logging(True)
    use_ray = use_ray or ray_address is not None
    if not use_ray and (stray := given(ctx, "workers", "cpus_per_worker", "shard_passages", "ray_timeout")):
        fail(f"{', '.join(stray)} apply with --ray only")
    if use_ray and (stray := given(ctx, "nlist", "nprobe", "hnsw_m", "ef_search", "faiss_on_disk")):
        fail(f"--ray builds take --faiss-index only; {', '.join(stray)} apply to local builds")
    if use_ray and not precompute_keys:
        fail("--ray builds precomputed keys; drop --lazy-keys")
    if max_words is not None and given(ctx, "max_tokens"):
        fail("--max-words and --max-tokens are two ways to chunk; give one")
    try:
        check_replaceable(out, INDEX_FORMAT, overwrite=force)  # before hours of building, not after
        if parse_spec(key_compression)[0] != "float16" and not precompute_keys:
            fail("--key-compression stores precomputed keys; drop --lazy-keys")
        passages = load_corpus(source, topic=topic, limit=limit)
        lm = load_lm(model)
        if max_words:
            passages = chunk_passages(passages, max_words=max_words)
        elif max_tokens:
            passages = chunk_passages(passages, max_tokens=max_tokens, tokenizer=lm.tokenizer)
        if not passages:
            fail(f"{source} holds no passages")
        settings: dict[str, Any] = dict(retriever_kind=retriever, index_factory=index_factory, key_layer=key_layer, encoding_prefix=encoding_prefix)
        faiss_options = {"nlist": nlist, "nprobe": nprobe, "hnsw_m": hnsw_m, "ef_search": ef_search, "on_disk": faiss_on_disk}
        if use_ray:
            from nest_integrations.index.distributed import build_index_on_ray

            index = build_index_on_ray(
                passages, lm, out, address=ray_address, workers=workers, cpus_per_worker=cpus_per_worker,
                shard_passages=shard_passages, key_codec=key_compression, overwrite=force, timeout_s=ray_timeout, **settings,
            )
            index.calibration()  # fitted here, saved into the index: no first question waits for it
        else:
            index = NestIndex.build(
                passages, lm, precompute_keys=precompute_keys, faiss_options=faiss_options, key_codec=key_compression, **settings
            )
            index.save(out, overwrite=force)
    except (ValueError, ImportError, FileNotFoundError) as err:
        fail(str(err))
    console.print(f"Wrote {out}: {len(passages)} passages")
    if Path(source).is_dir() and (left_out := left_out_files(source)):
        kinds, total = ", ".join(f"{count} {kind}" for kind, count in left_out.items()), sum(left_out.values())
        console.print(
            f"Left out {total} file{'s' if total > 1 else ''} of other kinds ({kinds}): a folder's "
            f"{', '.join(TEXT_SUFFIXES)} files (maybe .gz) and .jsonl files are read"
        )
    if index.precompute_rate is not None:
        codec = index.datastore.codec
        console.print(f"Encoded the datastore at {index.precompute_rate:,.0f} tokens/s, keys as {codec.spec} ({codec.bytes_per_key:,} B/token)")
    fitted = index.calibrations.get(lm.fingerprint())
    if fitted is not None:
        console.print(f"Calibrated alpha {fitted.alpha:.3f}, tau {fitted.tau:.3f} for {fitted.lm_name} in {fitted.seconds:.0f} s (saved with the index)")


@index_app.command("info")
def index_info(path: Path = typer.Argument(..., help="Index folder.")) -> None:
    """Show an index's manifest and datastore statistics."""
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        fail(f"{path} is not a NEST index (no manifest.json)")
    manifest = json.loads(manifest_path.read_text())
    table = Table(title=str(path), show_header=False)
    for key in ("format_version", "created", "lm", "key_layer", "encoding_prefix", "hidden_size", "dtype", "retriever", "counts", "precomputed_keys"):
        table.add_row(key, json.dumps(manifest.get(key), ensure_ascii=False))
    table.add_row("key_codec", json.dumps(manifest.get("key_codec", "float16")))
    dense_meta = path / "dense.json"
    if dense_meta.is_file():
        dense = json.loads(dense_meta.read_text())
        table.add_row("faiss index", f"{dense.get('factory')} (memory-mapped: {'yes' if dense.get('on_disk') else 'no'})")
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    table.add_row("size on disk", f"{size / 2**20:.1f} MiB")
    console.print(table)


@index_app.command("to-qdrant")
def index_to_qdrant(
    path: Path = typer.Argument(..., help="Index folder whose passages to export."),
    qdrant_path: Path = typer.Option(..., "--qdrant-path", help="Local Qdrant folder (created if needed; no server)."),
    collection: str = typer.Option(..., help="Collection to write."),
    force: bool = typer.Option(False, "--force", help="Replace an existing collection of that name."),
) -> None:
    """Write an index's passages into a local Qdrant collection (embedded with the bundled MiniLM),
    for ``nest generate --qdrant-path ... --collection ...``."""
    from nest_integrations.core.safe_io import manifest_format
    from nest_integrations.corpus.passages import load_passages_jsonl
    from nest_integrations.index.index_folder import FORMAT as INDEX_FORMAT

    if manifest_format(path) != INDEX_FORMAT:
        fail(f"{path} is not a NEST index")
    try:  # the qdrant extra (and LangChain) may be missing: a clear message, not a traceback
        from nest_integrations.langchain.qdrant import write_qdrant

        count = write_qdrant(load_passages_jsonl(path / "passages.jsonl"), qdrant_path, collection, overwrite=force)
    except (ValueError, ImportError) as err:
        fail(str(err))
    console.print(f"Wrote {count} passages to Qdrant collection {collection!r} in {qdrant_path}")


@app.command()
def retrieve(
    path: Path = typer.Argument(..., help="Index folder."),
    query: str = typer.Argument(..., help="Query text."),
    k: int = typer.Option(5, min=1, help="Passages to return."),
    tokens: bool = typer.Option(True, help="Also show each passage's token-datastore statistics."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per passage instead of a table."),
) -> None:
    """First-stage retrieval: the top passages for a query."""
    index = load_index(path)
    hits = index.retrieve(query, k)
    if as_json:
        for rank, (passage, score) in enumerate(hits, 1):
            sys.stdout.write(json.dumps({"rank": rank, "score": score, **passage.to_dict()}, ensure_ascii=False) + "\n")
        return
    if not hits:
        console.print("No passage matches.")
        return
    encoded = index.datastore.fetch([index.datastore.add(p) for p, _ in hits]) if tokens else []
    for rank, (passage, score) in enumerate(hits, 1):
        counts = f" · {len(encoded[rank - 1].token_ids)} tokens, {int(encoded[rank - 1].valid.sum())} entries" if tokens else ""
        heading = Text.assemble((f"{rank}. {passage.title or passage.id}", "bold"), (f"  score {score:.3f} · id {passage.id}{counts}", "dim"))
        console.print(heading)
        text = textwrap.fill(preview(passage.text), width=max(console.width - 3, 20))  # under the heading, no trailing blanks
        console.print(textwrap.indent(text, "   ") + "\n", markup=False, highlight=False, soft_wrap=True)


RETRIEVE_PREVIEW_CHARS = 320
"""Characters of each passage ``nest retrieve`` shows: four lines at 80 columns."""


def preview(text: str, limit: int = RETRIEVE_PREVIEW_CHARS) -> str:
    """``text`` on one line (runs of white space as one space), cut at a word boundary within
    ``limit`` characters with an ellipsis when it is longer."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"


@app.command()
def calibrate(
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    model: Optional[str] = typer.Option(None, help="LM to calibrate (default: the one the index was built with)."),
    n: int = typer.Option(12, min=1, help="Passages of the index's corpus to teacher-force, at most."),
    seed: int = typer.Option(0, help="Seed drawing the passages and their cuts."),
    budget_s: float = typer.Option(90.0, min=0, help="Wall-time bound in seconds (0: measure all --n passages)."),
) -> None:
    """Fit alpha/tau for an LM on an index's own passages and save them with the index.

    Runs by itself when `nest index build` builds an index, and the first time an index meets
    another LM; this reruns it.
    """
    index = load_index(datastore, model)
    try:
        result = index.calibrate(n=n, seed=seed, budget_s=budget_s or None)
    except ValueError as err:
        fail(str(err))
    console.print_json(result.model_dump_json())
    if index.folder is not None:
        console.print(f"Saved in {index.folder / 'calibration.json'} for {result.lm_name}.")
