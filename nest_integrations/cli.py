"""The ``nest`` command: build indexes, retrieve, generate, evaluate, benchmark, calibrate.

Every command runs offline on the embedded defaults unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from .corpus import DEFAULT_CHUNK_TOKENS
from .distributed import DEFAULT_CONNECT_TIMEOUT_S
from .key_codec import CODEC_HELP


app = typer.Typer(help="NEST: attributed, retrieval-grounded generation.", no_args_is_help=True, add_completion=False)
index_app = typer.Typer(help="Build and inspect NEST indexes.", no_args_is_help=True)
app.add_typer(index_app, name="index")
console = Console()
err_console = Console(stderr=True)

DEMO_INDEX_NAME = "wiki-people-default"
DEMO_TOPIC = "People"


def default_index_path(model: Optional[str] = None) -> Path:
    """Where ``nest demo`` / ``nest eval`` keep the default index: the 1,828 Wikipedia
    summaries of the topic People (the biography task's corpus), one folder per LM."""
    from .lm import cache_dir

    return cache_dir() / "indexes" / f"{DEMO_INDEX_NAME}{_model_tag(model)}"


def _model_tag(model: Optional[str]) -> str:
    """Suffix of the cached index folders built for ``model``: none for the default LM."""
    from .lm import embedded_model, is_default_lm

    if model is None or is_default_lm(model):
        return ""
    embedded = embedded_model(model)
    return "-" + (embedded.cache_name if embedded else re.sub(r"[^A-Za-z0-9_.-]+", "_", model))


def _fail(message: str) -> NoReturn:
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code=2)


def _setup_logging(verbose: bool) -> None:
    """Warnings only, and no weight-loading bars, unless ``verbose``: then INFO logs, the DEBUG lines
    libraries turn on for themselves (bm25s does at import) and transformers' loading bars."""
    from transformers.utils import logging as hf_logging

    handler = logging.StreamHandler()
    handler.setLevel(logging.NOTSET if verbose else logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)
    (hf_logging.enable_progress_bar if verbose else hf_logging.disable_progress_bar)()


@app.callback()
def _quiet_by_default(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show INFO logs and model-loading bars for any command."),
) -> None:
    """NEST: attributed, retrieval-grounded generation."""
    _setup_logging(verbose)


def _comma_list(text: str) -> list[str]:
    """The non-empty, stripped items of a comma-separated option value."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _numbers(text: str, kind: type, option: str) -> list[Any]:
    """The comma-separated numbers of an option value, each parsed by ``kind`` (int or float);
    a value that does not parse fails the command naming ``option``, before any work."""
    try:
        return [kind(item) for item in _comma_list(text)]
    except ValueError:
        _fail(f"{option} takes comma-separated {kind.__name__}s, got {text!r}")


def _positive(value: Optional[float]) -> Optional[float]:
    """Option callback: a float option must be above 0 (click's ranges cannot exclude 0)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be above 0, got {value:g}")
    return value


def _given(ctx: typer.Context, *names: str) -> list[str]:
    """The options among the parameters ``names`` that the command line (or environment) set, as
    their flags: to refuse an option that does not apply rather than ignore it silently."""
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    sources = {name: ctx.get_parameter_source(name) for name in names}  # click's ParameterSource (typer vendors click)
    return [flags[name] for name, source in sources.items() if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")]


def _load_index(path: Optional[Path], model: Optional[str] = None) -> Any:
    from .index import NestIndex
    from .lm import load_lm

    folder = path or default_index_path(model)
    if path is None and not (folder / "manifest.json").exists():
        _build_default_index(folder, model)
    try:
        return NestIndex.load(folder, load_lm(model) if model else None)
    except ValueError as err:
        _fail(str(err))


def _build_default_index(folder: Path, model: Optional[str] = None) -> None:
    from .corpus import load_wikipedia_summaries
    from .index import NestIndex
    from .lm import load_lm

    console.print(f"Building the default index over the Wikipedia summaries about people in {folder} (once)...")
    index = NestIndex.build(load_wikipedia_summaries(topic=DEMO_TOPIC), load_lm(model or "default"))
    index.save(folder)


# --------------------------------------------------------------------------- index
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
    cpus_per_worker: float = typer.Option(1.0, callback=_positive, help="CPUs each Ray worker reserves (its torch threads)."),
    shard_passages: int = typer.Option(256, min=1, help="Passages per key shard and per Ray task."),
    ray_timeout: float = typer.Option(
        DEFAULT_CONNECT_TIMEOUT_S, callback=_positive, help="Seconds a Ray cluster at --ray-address may take to answer before the command fails.",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Build a NEST index (passages, dense + BM25 retrieval, token datastore)."""
    from .corpus import chunk_passages, load_corpus
    from .index import FORMAT as INDEX_FORMAT
    from .index import NestIndex
    from .key_codec import parse_spec
    from .lm import load_lm
    from .safe_io import check_replaceable

    _setup_logging(verbose)
    use_ray = use_ray or ray_address is not None
    if not use_ray and (stray := _given(ctx, "workers", "cpus_per_worker", "shard_passages", "ray_timeout")):
        _fail(f"{', '.join(stray)} apply with --ray only")
    if use_ray and (stray := _given(ctx, "nlist", "nprobe", "hnsw_m", "ef_search", "faiss_on_disk")):
        _fail(f"--ray builds take --faiss-index only; {', '.join(stray)} apply to local builds")
    if use_ray and not precompute_keys:
        _fail("--ray builds precomputed keys; drop --lazy-keys")
    if max_words is not None and _given(ctx, "max_tokens"):
        _fail("--max-words and --max-tokens are two ways to chunk; give one")
    try:
        check_replaceable(out, INDEX_FORMAT, overwrite=force)  # before hours of building, not after
        if parse_spec(key_compression)[0] != "float16" and not precompute_keys:
            _fail("--key-compression stores precomputed keys; drop --lazy-keys")
        passages = load_corpus(source, topic=topic, limit=limit)
        lm = load_lm(model)
        if max_words:
            passages = chunk_passages(passages, max_words=max_words)
        elif max_tokens:
            passages = chunk_passages(passages, max_tokens=max_tokens, tokenizer=lm.tokenizer)
        if not passages:
            _fail(f"{source} holds no passages")
        settings: dict[str, Any] = dict(retriever_kind=retriever, index_factory=index_factory, key_layer=key_layer, encoding_prefix=encoding_prefix)
        faiss_options = {"nlist": nlist, "nprobe": nprobe, "hnsw_m": hnsw_m, "ef_search": ef_search, "on_disk": faiss_on_disk}
        if use_ray:
            from .distributed import build_index_on_ray

            index = build_index_on_ray(
                passages, lm, out, address=ray_address, workers=workers, cpus_per_worker=cpus_per_worker,
                shard_passages=shard_passages, key_codec=key_compression, overwrite=force, timeout_s=ray_timeout, **settings,
            )
        else:
            index = NestIndex.build(
                passages, lm, precompute_keys=precompute_keys, faiss_options=faiss_options, key_codec=key_compression, **settings
            )
            index.save(out, overwrite=force)
    except (ValueError, ImportError, FileNotFoundError) as err:
        _fail(str(err))
    console.print(f"Wrote {out}: {len(passages)} passages")
    if index.precompute_rate is not None:
        codec = index.datastore.codec
        console.print(f"Encoded the datastore at {index.precompute_rate:,.0f} tokens/s, keys as {codec.spec} ({codec.bytes_per_key:,} B/token)")


@index_app.command("info")
def index_info(path: Path = typer.Argument(..., help="Index folder.")) -> None:
    """Show an index's manifest and datastore statistics."""
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        _fail(f"{path} is not a NEST index (no manifest.json)")
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
    from .corpus import load_passages_jsonl
    from .index import FORMAT as INDEX_FORMAT
    from .safe_io import manifest_format
    from .retrieval.vector_store import write_qdrant

    if manifest_format(path) != INDEX_FORMAT:
        _fail(f"{path} is not a NEST index")
    try:
        count = write_qdrant(load_passages_jsonl(path / "passages.jsonl"), qdrant_path, collection, overwrite=force)
    except (ValueError, ImportError) as err:
        _fail(str(err))
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
    index = _load_index(path)
    hits = index.retrieve(query, k)
    if as_json:
        for rank, (passage, score) in enumerate(hits, 1):
            sys.stdout.write(json.dumps({"rank": rank, "score": score, **passage.to_dict()}, ensure_ascii=False) + "\n")
        return
    if not hits:
        console.print("No passage matches.")
        return
    table = Table("rank", "score", "id", "title", "text", *(["tokens", "entries"] if tokens else []))
    encoded = index.datastore.fetch([index.datastore.add(p) for p, _ in hits]) if tokens else []
    for rank, (passage, score) in enumerate(hits, 1):
        extra = [str(len(encoded[rank - 1].token_ids)), str(int(encoded[rank - 1].valid.sum()))] if tokens else []
        table.add_row(str(rank), f"{score:.3f}", passage.id, passage.title, passage.text[:80] + "...", *extra)
    console.print(table)


# --------------------------------------------------------------------------- generate
def _print_output(output: Any, title: str) -> None:
    from rich.panel import Panel

    from .attribution import render_terminal

    s = output.stats
    console.print(Panel(render_terminal(output), title=title))
    console.print(
        f"  attribution {output.attribution_ratio:.0%} · mean copied span {output.mean_copied_span_tokens:.1f} tokens · "
        f"{s.new_tokens} tokens in {s.forward_passes} forward passes · {s.wall_s:.2f} s "
        f"(retrieval {s.retrieval_s:.2f}, encoding {s.encode_s:.2f}, decoding {s.decode_s:.2f})",
        style="dim",
    )
    reason = getattr(s, "fallback_reason", None)
    if reason is not None and output.mode != "base":
        console.print(f"  NEST copied nothing and generated with the LM alone: {reason.replace('_', ' ')}", style="yellow")


@app.command()
def generate(
    ctx: typer.Context,
    prompt: Optional[str] = typer.Argument(None, help="The prompt (omit with --input)."),
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    query: Optional[str] = typer.Option(None, help="First-stage retrieval query (default: the prompt)."),
    mode: str = typer.Option("nest", help="base, rag, knnlm, nest or ra_nest."),
    max_new_tokens: int = typer.Option(128, min=1, help="Tokens to generate at most."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the output contract as one compact JSON line (append answers to a .jsonl file)."
    ),
    pretty: bool = typer.Option(False, "--pretty", help="With --json: indent the JSON for reading instead."),
    input_path: Optional[Path] = typer.Option(
        None, "--input", help="JSONL of {id?, prompt, query?} or {id?, messages: [{role, content}, ...], query?} to generate for."
    ),
    output_path: Optional[Path] = typer.Option(
        None, "--output", help="JSONL to write (with --input), in input order; a killed run resumes, keeping the items done."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="With --input: replace --output (the output of an earlier job, never another file) "
        "instead of resuming it; a resume needs the same index, LM and decoding settings.",
    ),
    batch_size: int = typer.Option(8, min=1, help="With --input: items per batched-decoder call (and per Ray task)."),
    use_ray: bool = typer.Option(False, "--ray", help="With --input: spread the items over Ray workers, each holding the index."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster HOST:PORT (implies --ray)."),
    workers: Optional[int] = typer.Option(None, min=1, help="Ray workers (default: cluster CPUs / --cpus-per-worker)."),
    cpus_per_worker: float = typer.Option(1.0, callback=_positive, help="CPUs each Ray worker reserves."),
    ray_timeout: float = typer.Option(
        DEFAULT_CONNECT_TIMEOUT_S, callback=_positive, help="Seconds a Ray cluster at --ray-address may take to answer before the command fails.",
    ),
    model: Optional[str] = typer.Option(None, help="LM to decode with (default: the one that built the index)."),
    qdrant_path: Optional[Path] = typer.Option(
        None, "--qdrant-path", help="First stage from a local Qdrant folder instead of an index (with --collection; "
        "passages are encoded lazily when retrieved; nest index to-qdrant writes one).",
    ),
    collection: Optional[str] = typer.Option(None, help="Qdrant collection (with --qdrant-path)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Generate with attribution; one prompt, or a batch from --input to --output."""
    from .config import MODES, NestConfig

    _setup_logging(verbose)
    if mode not in MODES:
        _fail(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    try:
        NestConfig().updated(mode=mode, max_new_tokens=max_new_tokens)
    except ValueError as err:
        _fail(str(err))
    if (prompt is None) == (input_path is None):
        _fail("give either a PROMPT or --input FILE")
    if input_path is not None and output_path is None:
        _fail("--input needs --output")
    if input_path is None and (stray := _given(ctx, "output_path", "restart", "batch_size")):
        _fail(f"{', '.join(stray)} apply with --input only")
    if pretty and not as_json:
        _fail("--pretty formats --json; add --json")
    if input_path is not None and (stray := _given(ctx, "query", "as_json", "pretty")):
        _fail(f"{', '.join(stray)} apply to one PROMPT; with --input each item has its own query, and outputs go to --output")
    if (qdrant_path is None) != (collection is None):
        _fail("--qdrant-path and --collection go together")
    if qdrant_path is not None and (datastore is not None or input_path is not None):
        _fail("--qdrant-path generates for one PROMPT, without --datastore or --input")
    use_ray = use_ray or ray_address is not None
    if use_ray and input_path is None:
        _fail("--ray needs --input")
    if not use_ray and (stray := _given(ctx, "workers", "cpus_per_worker", "ray_timeout")):
        _fail(f"{', '.join(stray)} apply with --ray only")
    if input_path is not None:
        assert output_path is not None
        _generate_items(
            input_path, output_path, datastore, model=model, overrides={"mode": mode, "max_new_tokens": max_new_tokens},
            batch_size=batch_size, restart=restart, ray=(use_ray, ray_address, workers, cpus_per_worker, ray_timeout),
        )
        return
    try:
        decoder = _qdrant_decoder(qdrant_path, collection, model) if qdrant_path is not None else _load_index(datastore, model).decoder()
        decoder.config = decoder.config.updated(mode=mode, max_new_tokens=max_new_tokens)
    except ValueError as err:
        _fail(str(err))
    output = decoder.generate(prompt, query=query)
    if as_json:
        sys.stdout.write(json.dumps(output.to_dict(), ensure_ascii=False, **({"indent": 2} if pretty else {"separators": (",", ":")})) + "\n")
    else:
        _print_output(output, f"{mode}")


def _generate_items(
    input_path: Path, output_path: Path, datastore: Optional[Path], *, model: Optional[str], overrides: dict[str, Any],
    batch_size: int, restart: bool, ray: tuple[bool, Optional[str], Optional[int], float, float],
) -> None:
    """``nest generate --input``: a resumable job (:mod:`nest_integrations.jobs`), in this process or on Ray.

    The input and the output file are checked before the index or the LM is loaded; the
    settings a resume must share (index, LM, decoding) once they are."""
    from .config import NestConfig
    from .index import index_identity
    from .jobs import check_output, in_process_runner, job_settings, read_items, run_job

    use_ray, address, workers, cpus_per_worker, timeout_s = ray
    folder = datastore or default_index_path()
    try:
        items = read_items(input_path)
        check_output(output_path)
        if datastore is None and not (folder / "manifest.json").exists():
            _build_default_index(folder)
        identity = index_identity(folder)
        if use_ray:
            from .distributed import ray_cluster, ray_generator

            with ray_cluster(address, timeout_s=timeout_s), ray_generator(
                folder, model=model, overrides=overrides, workers=workers, cpus_per_worker=cpus_per_worker
            ) as ray_runner:
                settings = job_settings(index=identity, lm_fingerprint=ray_runner.lm_fingerprint, config=NestConfig().updated(**overrides))
                runner, tally = _tallied(ray_runner)
                started = time.perf_counter()
                generated = run_job(items, output_path, runner, settings=settings, chunk_size=batch_size, restart=restart)
                tally.wall_s = time.perf_counter() - started
        else:
            decoder = _load_index(folder, model).decoder()
            decoder.config = decoder.config.updated(**overrides)
            decoder.ensure_calibration(decoder.config)
            # The calibrated alpha/tau decide the outputs too: a resume after `nest calibrate` is refused.
            alpha, tau = decoder.rrc_parameters(decoder.config)
            settings = job_settings(index=identity, lm_fingerprint=decoder.lm.fingerprint(), config=decoder.config.updated(alpha=alpha, tau=tau))
            runner, tally = _tallied(in_process_runner(decoder))
            started = time.perf_counter()
            generated = run_job(items, output_path, runner, settings=settings, chunk_size=batch_size, restart=restart)
            tally.wall_s = time.perf_counter() - started
    except (ValueError, ImportError) as err:
        _fail(str(err))
    kept = len(items) - generated
    console.print(f"Wrote {len(items)} generations to {output_path}" + (f" ({kept} kept from an earlier run)" if kept else ""))
    if generated:
        sys.stderr.write(tally.summary() + "\n")


@dataclass
class _BatchTally:
    """What a batch job generated now: items, tokens and their own wall times (``stats.wall_s``)."""

    items: int = 0
    new_tokens: int = 0
    item_wall_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    """The job's generation time (loading excluded), set once it ends."""

    def add(self, outputs: list[dict[str, Any]]) -> None:
        for out in outputs:
            self.items += 1
            self.new_tokens += int(out["stats"]["new_tokens"])
            self.item_wall_s.append(float(out["stats"]["wall_s"]))

    def summary(self) -> str:
        """One line: ``batch: N items, T tokens in W s (R tokens/s); item wall mean M s, max X s``."""
        rate = self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0
        walls = self.item_wall_s or [0.0]
        return (
            f"batch: {self.items} items, {self.new_tokens} tokens in {self.wall_s:.2f} s ({rate:.1f} tokens/s); "
            f"item wall mean {sum(walls) / len(walls):.2f} s, max {max(walls):.2f} s"
        )


def _tallied(runner: Any) -> tuple[Any, _BatchTally]:
    """``runner`` (a :data:`~nest_integrations.jobs.ChunkRunner`) counting what it generates into a tally."""
    tally = _BatchTally()

    def run(chunks: Any) -> Any:
        for number, outputs in runner(chunks):
            tally.add(outputs)
            yield number, outputs

    return run, tally


def _qdrant_decoder(path: Path, collection: Optional[str], model: Optional[str]) -> Any:
    """A decoder whose first stage is a local Qdrant collection (lazy token datastore)."""
    from .lm import load_lm
    from .retrieval.vector_store import LangChainVectorStoreRetriever, open_qdrant, store_decoder

    try:
        retriever = LangChainVectorStoreRetriever(open_qdrant(path, str(collection)))
    except ImportError as err:
        _fail(str(err))
    return store_decoder(retriever, load_lm(model or "default"))


@app.command()
def chat(
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    mode: str = typer.Option("nest", help="The first mode (base, rag, knnlm, nest or ra_nest); /mode switches."),
    max_new_tokens: int = typer.Option(256, min=1, help="Tokens per answer at most."),
    model: Optional[str] = typer.Option(None, help="LM to decode with (default: the one that built the index)."),
    history: bool = typer.Option(
        True, "--history/--no-history", help="Keep the questions asked (Up/Down, Ctrl-R) in the cache folder across sessions."
    ),
) -> None:
    """Ask questions in a conversation: follow-ups are retrieved with the earlier questions, answers show
    their copied spans and numbered sources. /help lists the commands (/mode, /sources, /save); Ctrl-D ends."""
    from .chat_session import ChatSession, terminal_reader
    from .config import MODES
    from .lm import cache_dir

    if mode not in MODES:
        _fail(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    if not sys.stdin.isatty():
        _fail("nest chat needs a terminal; for questions from a file use nest generate --input")
    decoder = _load_index(datastore, model).decoder()
    session = ChatSession(decoder, console, mode=mode, max_new_tokens=max_new_tokens)
    session.run(terminal_reader(session, cache_dir() / "chat_history" if history else None))


@app.command()
def demo(
    prompt: str = typer.Option("Tell me a bio of Ada Lovelace.", help="The prompt."),
    query: str = typer.Option("Ada Lovelace", help="First-stage retrieval query."),
    max_new_tokens: int = typer.Option(96, min=1, help="Tokens to generate."),
) -> None:
    """Build (once) the default index over the Wikipedia summaries and compare NEST with the base LM."""
    index = _load_index(None)
    decoder = index.decoder()
    outputs = {mode: decoder.generate(prompt, query=query, mode=mode, max_new_tokens=max_new_tokens) for mode in ("base", "nest")}
    console.print(f"[bold]Prompt:[/bold] {prompt}   [dim](retrieval query: {query})[/dim]")
    for mode, output in outputs.items():
        _print_output(output, "NEST (copied spans highlighted, sources numbered)" if mode == "nest" else "base LM")
    base, nest = outputs["base"].stats, outputs["nest"].stats
    if nest.wall_s > 0 and base.new_tokens and nest.new_tokens:
        speed = (base.wall_s / base.new_tokens) / (nest.wall_s / nest.new_tokens)
        console.print(f"NEST: {speed:.1f}x the base LM's tokens per second on this prompt, everything included.")


# --------------------------------------------------------------------------- evaluation
def _docs_index(task: str, chunking: str, model: Optional[str] = None) -> Path:
    """The folder of a documentation task's default index, built into the cache once per
    version of its passages (docs: standard-library docstrings; markdown-docs: Fastify's docs)."""
    from .evaluation.runner import docs_domain_passages, passages_fingerprint
    from .index import NestIndex
    from .lm import cache_dir, load_lm

    passages = docs_domain_passages(task, chunking)
    folder = cache_dir() / "indexes" / f"{task}-{chunking}-{passages_fingerprint(passages)}{_model_tag(model)}"
    if not (folder / "manifest.json").exists():
        console.print(f"Building the {task} index ({len(passages)} passages, {chunking}) in {folder} (once)...")
        NestIndex.build(passages, load_lm(model or "default")).save(folder)
    return folder


@app.command("eval")
def evaluate(
    task: str = typer.Option("bio", help="bio, completion, qa, wiki-qa, wiki-qa-hard, docs or markdown-docs."),
    n: Optional[int] = typer.Option(None, min=1, help="Items per condition (default: 100; every question for qa and docs)."),
    seed: int = typer.Option(0, help="Sampling seed of the items."),
    datastore: Optional[Path] = typer.Option(
        None, "--datastore", "-d", help="Index folder (default: the demo index; for docs and markdown-docs their own index)."
    ),
    modes: str = typer.Option("base,rag,knnlm,nest,ra_nest", help="Comma-separated modes."),
    max_new_tokens: Optional[int] = typer.Option(
        None, min=1, help="Tokens per generation (default: 64 for qa, wiki-qa and docs, 128 otherwise)."
    ),
    qa_path: Optional[Path] = typer.Option(None, "--qa", help="QA JSONL (task qa)."),
    docs_chunking: str = typer.Option(
        "cli", help="docs and markdown-docs without -d: 'cli' (nest index build's default chunking), 'splitter' "
        "(LangChain's default splitter) or, for markdown-docs, 'sentence' (LlamaIndex's default SentenceSplitter).",
    ),
    out: Path = typer.Option(Path("runs/eval"), help="Output folder (items.jsonl, summary.json, summary.md)."),
    key_compression: Optional[str] = typer.Option(
        None, help=f"Over an index with lazy keys: store the keys of retrieved passages as {CODEC_HELP}, the codec "
        "trained first on --codec-sample random passages (an index built with --key-compression uses its own).",
    ),
    codec_sample: int = typer.Option(384, min=1, help="Passages encoded to train --key-compression."),
    model: Optional[str] = typer.Option(
        None, help="LM: 'default', another embedded model ('gemma-3-270m'), a local folder or a hub id available "
        "offline; without -d its default indexes are built for it once."
    ),
) -> None:
    """Compare the modes on the same items in one run.

    nest eval --task bio; nest eval --task wiki-qa; nest eval --task docs [--docs-chunking splitter];
    nest eval --task markdown-docs [--docs-chunking splitter|sentence].
    """
    from .config import MODES
    from .evaluation.runner import DOCS_DOMAIN_CHUNKINGS, run_eval
    from .evaluation.tasks import TASKS

    if task not in TASKS:
        _fail(f"unknown --task {task!r}; choose from {', '.join(TASKS)}")
    if not _comma_list(modes) or set(_comma_list(modes)) - set(MODES):
        _fail(f"--modes takes some of {', '.join(MODES)}, got {modes!r}")
    if task == "qa" and qa_path is None:
        _fail("--task qa needs --qa FILE (a JSONL of {\"question\", \"answers\"})")
    if key_compression is not None:
        from .key_codec import parse_spec

        try:
            parse_spec(key_compression)
        except ValueError as err:
            _fail(f"--key-compression: {err}")
    chunkings = DOCS_DOMAIN_CHUNKINGS.get(task, DOCS_DOMAIN_CHUNKINGS["docs"])
    if docs_chunking not in chunkings:
        _fail(f"unknown --docs-chunking {docs_chunking!r} for {task}; choose from {', '.join(chunkings)}")
    if task in DOCS_DOMAIN_CHUNKINGS and datastore is None:
        datastore = _docs_index(task, docs_chunking, model)
    index = _load_index(datastore, model)
    try:
        if key_compression is not None:
            codec = index.datastore.train_codec(key_compression, sample_passages=codec_sample, seed=seed)
            console.print(f"Keys stored as {codec.spec} ({codec.bytes_per_key:,} B/token)")
        run_eval(
            index, task, n=n, seed=seed, modes=tuple(_comma_list(modes)),
            max_new_tokens=max_new_tokens, out_dir=out, qa_path=qa_path,
        )
    except ValueError as err:
        _fail(str(err))
    console.print((out / "summary.md").read_text())


SWEEPS = ("gamma", "delta", "alpha")
"""The knobs ``nest bench --sweep`` varies."""


@app.command()
def bench(
    ctx: typer.Context,
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    n: Optional[int] = typer.Option(None, min=1, help="Prompts (default: 8; 16 with --batching; 3 per size and first stage with --scale)."),
    max_new_tokens: Optional[int] = typer.Option(None, min=1, help="Tokens per generation (default: 64; 32 with --scale)."),
    out: Optional[Path] = typer.Option(
        None, help="Output folder for bench.json and bench.md (default: runs/bench; runs/bench-batching with --batching; "
        "runs/scale with --scale: scale.json, scale.md, scale.png)."
    ),
    batching: bool = typer.Option(
        False, "--batching",
        help="Throughput instead of the mode table: NEST one by one, batched (B = 1, 4, 8, 16), 8 concurrent callers "
        "(threads, ChatNest async), the LM alone batched, in-context RAG and prompt lookup, with answer quality; "
        "about 15 minutes for --n 16 on 2 lightly loaded CPU cores, twice that under heavy load.",
    ),
    seed: int = typer.Option(0, help="Sampling seed of the --batching prompts."),
    repeats: int = typer.Option(
        1, min=1, help="--batching rounds over all configurations; each row keeps its fastest (each round costs a full run)."
    ),
    kinds: str = typer.Option(
        "bio,wiki-qa,wiki-qa-outside",
        help="--batching prompt kinds, in equal shares: bio, wiki-qa (people in the index), wiki-qa-outside "
        "(topics the index lacks: NEST writes with the LM alone).",
    ),
    sweep: Optional[str] = typer.Option(None, help="Also sweep one knob: gamma, delta or alpha."),
    values: Optional[str] = typer.Option(None, help="Comma-separated values for --sweep."),
    scale: bool = typer.Option(
        False, "--scale", help="Instead: first-stage memory, build time, query latency, recall and NEST ms/token against "
        "corpus size, duplicating the bundled summaries (no index needed).",
    ),
    sizes: str = typer.Option("10000,30000,100000,300000,1000000", help="Corpus sizes for --scale, increasing."),
    scale_indexes: str = typer.Option("flat,ivf,hnsw", help="First stages for --scale (flat is always measured)."),
    hnsw_max: int = typer.Option(100_000, min=1, help="Largest size --scale builds HNSW for (its build is the slowest)."),
) -> None:
    """Speed: every mode against plain transformers generate, in one run; or --batching throughput; optional knob sweep; or --scale."""
    size_list = _numbers(sizes, int, "--sizes")
    sweep_values = _numbers(values, float, "--values") if values is not None else []
    if sweep is not None and sweep not in SWEEPS:
        _fail(f"unknown --sweep {sweep!r}; choose from {', '.join(SWEEPS)}")
    if scale and (stray := _given(ctx, "batching", "sweep", "values", "datastore", "repeats", "kinds")):
        _fail(f"{', '.join(stray)} do not apply with --scale")
    if scale:
        from .evaluation.scale_bench import run_scale_bench
        from .lm import cache_dir

        folder = out or Path("runs/scale")
        try:
            run_scale_bench(
                out_dir=folder, sizes=size_list,
                indexes=_comma_list(scale_indexes), hnsw_max=hnsw_max,
                prompts=3 if n is None else n, max_new_tokens=max_new_tokens or 32,
                embeddings_cache=cache_dir() / "scale",
            )
        except ValueError as err:
            _fail(str(err))
        console.print((folder / "scale.md").read_text())
        return
    from .evaluation.bench import run_bench, run_sweep

    if batching and sweep:
        _fail("--sweep runs with the mode table, not with --batching")
    if sweep and not values:
        _fail("--sweep needs --values")
    n = n if n is not None else (16 if batching else 8)
    max_new_tokens = max_new_tokens or 64
    out = out or Path("runs/bench-batching" if batching else "runs/bench")
    index = _load_index(datastore)
    try:
        if batching:
            from .evaluation.throughput import run_throughput

            run_throughput(
                index, n=n, seed=seed, max_new_tokens=max_new_tokens, out_dir=out, repeats=repeats,
                kinds=_comma_list(kinds),
            )
        else:
            run_bench(index, n=n, max_new_tokens=max_new_tokens, out_dir=out)
    except (ValueError, ImportError) as err:
        _fail(str(err))
    console.print((out / "bench.md").read_text())
    if sweep:
        run_sweep(index, param=sweep, values=sweep_values, n=n, out_dir=out)


@app.command("bench-ray")
def bench_ray(
    passages: int = typer.Option(500, min=1, help="Wikipedia summaries about people to build over."),
    items: int = typer.Option(6, min=1, help="Biography prompts to generate for."),
    max_new_tokens: int = typer.Option(48, min=1, help="Tokens per generation."),
    batch_size: int = typer.Option(2, min=1, help="Items per batched-decoder call and per Ray task."),
    workers: int = typer.Option(2, min=1, help="Ray workers, one CPU each."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster HOST:PORT (default: a local one)."),
    out: Path = typer.Option(Path("runs/ray"), help="Output folder (ray.json, ray.md)."),
) -> None:
    """Ray against one process: index build and batch generation, timed in one run."""
    from .evaluation.ray_bench import run_ray_bench

    try:
        run_ray_bench(
            passages=passages, items=items, max_new_tokens=max_new_tokens, batch_size=batch_size,
            workers=workers, address=ray_address, out_dir=out,
        )
    except (ValueError, ImportError) as err:
        _fail(str(err))
    console.print((out / "ray.md").read_text())


@app.command("bench-keys")
def bench_keys(
    datastore: Optional[Path] = typer.Option(
        None, "--datastore", "-d", help="Index folder with float16 or lazy keys (default: the demo index)."
    ),
    codecs: str = typer.Option(",".join(("sq8", "pq48", "opq48", "pq96", "opq96", "pq144")), help=f"Comma-separated codecs: {CODEC_HELP}."),
    n: int = typer.Option(12, min=1, help="Biography prompts whose decoding queries are searched."),
    seed: int = typer.Option(0, help="Sampling seed of the prompts and the training sample."),
    max_new_tokens: int = typer.Option(64, min=1, help="Tokens the LM writes per prompt (queries per prompt)."),
    sample_passages: int = typer.Option(384, min=1, help="Corpus passages encoded to train every codec."),
    queries: str = typer.Option(
        "base,nest", help="Comma-separated modes whose answers give the queries: base (the LM alone, far from the corpus), nest (the decoder's own)."
    ),
    out: Path = typer.Option(Path("runs/bench-keys"), help="Output folder (key_bench.json, key_bench.md)."),
) -> None:
    """Compressed keys vs float16: bytes per token, neighbour agreement, lambda change, search speed."""
    from .evaluation.key_bench import QUERY_MODES, run_key_bench
    from .key_codec import parse_spec

    try:
        [parse_spec(codec) for codec in _comma_list(codecs)]
    except ValueError as err:
        _fail(f"--codecs: {err}")
    if not _comma_list(queries) or set(_comma_list(queries)) - set(QUERY_MODES):
        _fail(f"--queries takes {', '.join(QUERY_MODES)}, got {queries!r}")
    index = _load_index(datastore)
    try:
        run_key_bench(
            index, codecs=_comma_list(codecs), n=n, seed=seed,
            max_new_tokens=max_new_tokens, sample_passages=sample_passages,
            query_modes=_comma_list(queries), out_dir=out,
        )
    except ValueError as err:
        _fail(str(err))
    console.print((out / "key_bench.md").read_text())


@app.command("bench-store")
def bench_store(
    out: Path = typer.Option(Path("runs/store-bench"), help="Output folder (store_bench.json, table.md)."),
    n: int = typer.Option(12, min=1, help="Questions of the markdown-docs domain (stratified by kind)."),
    seed: int = typer.Option(0, help="Sampling seed of the questions."),
    integrations: str = typer.Option("langchain,llama_index", help="Comma-separated: langchain, llama_index."),
    chunk_size: Optional[int] = typer.Option(None, min=1, help="Splitter chunk size (default: the README quick start's)."),
    max_new_tokens: Optional[int] = typer.Option(None, min=1, help="NEST's token budget (default: the README's)."),
    rag_max_new_tokens: Optional[int] = typer.Option(None, min=1, help="RAG's token budget (default: NEST's)."),
    store_dir: Optional[Path] = typer.Option(None, help="Keep the saved stores here (default: a temporary folder)."),
    reuse_stores: bool = typer.Option(False, help="Load the stores already saved in --store-dir."),
) -> None:
    """NEST against in-context RAG through the README's LangChain and LlamaIndex quick starts, on stores
    with precomputed keys, saved and loaded memory-mapped (wall time per question, recall)."""
    from .evaluation.store_bench import INTEGRATIONS, README_CHUNK_SIZE, README_MAX_NEW_TOKENS, run_store_bench

    chosen = _comma_list(integrations)
    if not chosen or set(chosen) - set(INTEGRATIONS):
        _fail(f"--integrations takes some of {', '.join(INTEGRATIONS)}, got {integrations!r}")
    if reuse_stores and store_dir is None:
        _fail("--reuse-stores needs --store-dir")
    run_store_bench(
        out_dir=out, n=n, seed=seed, integrations=chosen, chunk_size=chunk_size or README_CHUNK_SIZE,
        max_new_tokens=max_new_tokens or README_MAX_NEW_TOKENS, rag_max_new_tokens=rag_max_new_tokens,
        store_dir=store_dir, reuse_stores=reuse_stores,
    )
    console.print((out / "table.md").read_text())


@app.command("bench-gate")
def bench_gate(
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder of the people summaries (default: the demo index)."),
    n: int = typer.Option(200, min=1, help="Biographies (people of the index)."),
    seed: int = typer.Option(1, help="Sampling seed of the people."),
    k: int = typer.Option(8, min=1, help="First-stage passages per query."),
    out: Path = typer.Option(Path("runs/bench-gate"), help="Output folder (gate.json, gate.md)."),
) -> None:
    """What the relevance gate keeps for biographies, with the summary present and removed (no generation)."""
    from .evaluation.gate_bench import gate_report

    index = _load_index(datastore)
    try:
        gate_report(index, n=n, seed=seed, k=k, out_dir=out)
    except ValueError as err:
        _fail(str(err))
    console.print((out / "gate.md").read_text())


@app.command("bench-device")
def bench_device(
    models: str = typer.Option("default,gemma-3-270m", help="Comma-separated LMs: embedded names, local folders or hub ids available offline."),
    device: str = typer.Option("cuda", help="Where to run: cuda, cuda:<i>, mps or cpu."),
    dtypes: str = typer.Option("float16,bfloat16", help="Comma-separated dtypes: float32, float16, bfloat16."),
    n: int = typer.Option(8, min=1, help="Timed biography prompts per model and dtype (one more runs untimed first)."),
    max_new_tokens: int = typer.Option(96, min=1, help="Tokens per generation."),
    passages: int = typer.Option(300, min=1, help="Wikipedia summaries about people to index (keys precomputed on the device)."),
    out: Path = typer.Option(Path("runs/device-bench"), help="Output folder (device_bench.json, device_bench.md)."),
) -> None:
    """NEST (base and nest modes) against the LM's own greedy generate, per model and dtype, on a device."""
    from .evaluation.device_bench import check_device, check_dtypes, run_device_bench

    if not _comma_list(models):
        _fail("--models is empty")
    try:
        check_dtypes(_comma_list(dtypes))
    except ValueError as err:
        _fail(f"--dtypes: {err}")
    try:
        check_device(device)
    except ValueError as err:
        _fail(f"--device: {err}")
    try:
        run_device_bench(
            models=_comma_list(models), device=device, dtypes=_comma_list(dtypes), n=n,
            max_new_tokens=max_new_tokens, passages=passages, out_dir=out,
        )
    except ValueError as err:
        _fail(str(err))
    console.print((out / "device_bench.md").read_text())


@app.command()
def calibrate(
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    model: Optional[str] = typer.Option(None, help="LM to calibrate (default: the one the index was built with)."),
    n: int = typer.Option(12, min=1, help="Passages of the index's corpus to teacher-force, at most."),
    seed: int = typer.Option(0, help="Seed drawing the passages and their cuts."),
    budget_s: float = typer.Option(90.0, min=0, help="Wall-time bound in seconds (0: measure all --n passages)."),
) -> None:
    """Fit alpha/tau for an LM on an index's own passages and save them with the index.

    Runs by itself the first time an index meets an LM without a calibration; this reruns it.
    """
    index = _load_index(datastore, model)
    try:
        result = index.calibrate(n=n, seed=seed, budget_s=budget_s or None)
    except ValueError as err:
        _fail(str(err))
    console.print_json(result.model_dump_json())
    if index.folder is not None:
        console.print(f"Saved in {index.folder / 'calibration.json'} for {result.lm_name}.")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
