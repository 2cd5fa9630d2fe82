"""``nest bench SUBCOMMAND``: every benchmark, one subcommand each, writing JSON and Markdown to ``--out``.

``speed`` (the modes against plain transformers generate), ``batching`` (throughput), ``scale``
(first stage against corpus size), ``ray``, ``keys`` (compressed keys), ``store`` (the quick
starts' saved stores), ``gate`` (the relevance gate), ``windows`` (the answer windows the
decoder plans), ``device`` (an accelerator), ``startup`` (the command's own start-up). Each
runs the benchmarks project (``nest_benchmarks``, imported when the subcommand runs; without it
the command fails naming its install command). ``nest bench`` alone lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from nest_integrations.store.key_codec import CODEC_HELP
from .common import (
    STARTUP_T0_ENV, STARTUP_TRACE_ENV, comma_list, console, default_index_path, docs_index, fail, load_index, numbers,
    require_benchmarks,
)

bench_app = typer.Typer(
    help="Benchmarks: speed, batching, scale, ray, keys, store, gate, windows, device, startup.", no_args_is_help=True,
)


@bench_app.callback()
def bench() -> None:
    """Benchmarks, one subcommand each; every one writes JSON and Markdown to --out."""
    require_benchmarks("nest bench")


SWEEPS = ("gamma", "delta", "alpha")
"""The knobs ``nest bench speed --sweep`` varies."""

DEFAULT_SIZES = "10000,30000,100000,300000,1000000"


# --------------------------------------------------------------------------- speed, batching, scale
def run_speed(datastore: Optional[Path], n: int, max_new_tokens: int, out: Path, sweep: Optional[str], values: Optional[str]) -> None:
    """The mode table (and an optional knob sweep) of ``nest bench speed``."""
    sweep_values = numbers(values, float, "--values") if values is not None else []
    if sweep is not None and sweep not in SWEEPS:
        fail(f"unknown --sweep {sweep!r}; choose from {', '.join(SWEEPS)}")
    if sweep and not values:
        fail("--sweep needs --values")
    from nest_benchmarks.bench import run_bench, run_sweep

    index = load_index(datastore)
    try:
        run_bench(index, n=n, max_new_tokens=max_new_tokens, out_dir=out)
    except (ValueError, ImportError) as err:
        fail(str(err))
    console.print((out / "bench.md").read_text())
    if sweep:
        run_sweep(index, param=sweep, values=sweep_values, n=n, out_dir=out)


def run_batching(datastore: Optional[Path], n: int, max_new_tokens: int, out: Path, seed: int, repeats: int, kinds: str) -> None:
    """The throughput table of ``nest bench batching``."""
    from nest_benchmarks.throughput import run_throughput

    index = load_index(datastore)
    try:
        run_throughput(index, n=n, seed=seed, max_new_tokens=max_new_tokens, out_dir=out, repeats=repeats, kinds=comma_list(kinds))
    except (ValueError, ImportError) as err:
        fail(str(err))
    console.print((out / "bench.md").read_text())


def run_scale(n: int, max_new_tokens: int, out: Path, sizes: str, scale_indexes: str, hnsw_max: int) -> None:
    """The scaling table of ``nest bench scale``."""
    size_list = numbers(sizes, int, "--sizes")
    from nest_benchmarks.scale_bench import run_scale_bench
    from nest_integrations.model.lm import cache_dir

    try:
        run_scale_bench(
            out_dir=out, sizes=size_list, indexes=comma_list(scale_indexes), hnsw_max=hnsw_max,
            prompts=n, max_new_tokens=max_new_tokens, embeddings_cache=cache_dir() / "scale",
        )
    except ValueError as err:
        fail(str(err))
    console.print((out / "scale.md").read_text())


DATASTORE_OPTION = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index).")


@bench_app.command("speed")
def speed(
    datastore: Optional[Path] = DATASTORE_OPTION,
    n: int = typer.Option(8, min=1, help="Prompts."),
    max_new_tokens: int = typer.Option(64, min=1, help="Tokens per generation."),
    out: Path = typer.Option(Path("runs/bench"), help="Output folder (bench.json, bench.md)."),
    sweep: Optional[str] = typer.Option(None, help="Also sweep one knob: gamma, delta or alpha."),
    values: Optional[str] = typer.Option(None, help="Comma-separated values for --sweep."),
) -> None:
    """Speed: every mode against plain transformers generate, in one run; optional knob sweep."""
    run_speed(datastore, n, max_new_tokens, out, sweep, values)


@bench_app.command("batching")
def batching(
    datastore: Optional[Path] = DATASTORE_OPTION,
    n: int = typer.Option(16, min=1, help="Prompts."),
    max_new_tokens: int = typer.Option(64, min=1, help="Tokens per generation."),
    out: Path = typer.Option(Path("runs/bench-batching"), help="Output folder (bench.json, bench.md)."),
    seed: int = typer.Option(0, help="Sampling seed of the prompts."),
    repeats: int = typer.Option(1, min=1, help="Rounds over all configurations; each row keeps its fastest (each round costs a full run)."),
    kinds: str = typer.Option(
        "bio,wiki-qa,wiki-qa-outside",
        help="Prompt kinds, in equal shares: bio, wiki-qa (people in the index), wiki-qa-outside "
        "(topics the index lacks: NEST writes with the LM alone).",
    ),
) -> None:
    """Throughput: NEST one by one, batched (B = 1, 4, 8, 16), 8 concurrent callers (threads, ChatNest async),
    the LM alone batched, in-context RAG and prompt lookup, with answer quality; a long run
    (docs/serving.md gives its duration on 2 CPU cores)."""
    run_batching(datastore, n, max_new_tokens, out, seed, repeats, kinds)


@bench_app.command("scale")
def scale(
    n: int = typer.Option(3, min=1, help="Prompts per size and first stage."),
    max_new_tokens: int = typer.Option(32, min=1, help="Tokens per generation."),
    out: Path = typer.Option(Path("runs/scale"), help="Output folder (scale.json, scale.md, scale.png)."),
    sizes: str = typer.Option(DEFAULT_SIZES, help="Corpus sizes, increasing."),
    scale_indexes: str = typer.Option("flat,ivf,hnsw", help="First stages (flat is always measured)."),
    hnsw_max: int = typer.Option(100_000, min=1, help="Largest size HNSW is built for (its build is the slowest)."),
) -> None:
    """First-stage memory, build time, query latency, recall and NEST ms/token against corpus size,
    duplicating the bundled summaries (no index needed)."""
    run_scale(n, max_new_tokens, out, sizes, scale_indexes, hnsw_max)


# --------------------------------------------------------------------------- the other benches
@bench_app.command("ray")
def ray(
    passages: int = typer.Option(500, min=1, help="Wikipedia summaries about people to build over."),
    items: int = typer.Option(6, min=1, help="Biography prompts to generate for."),
    max_new_tokens: int = typer.Option(48, min=1, help="Tokens per generation."),
    batch_size: int = typer.Option(2, min=1, help="Items per batched-decoder call and per Ray task."),
    workers: int = typer.Option(2, min=1, help="Ray workers, one CPU each."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster HOST:PORT (default: a local one)."),
    out: Path = typer.Option(Path("runs/ray"), help="Output folder (ray.json, ray.md)."),
) -> None:
    """Ray against one process: index build and batch generation, timed in one run."""
    from nest_benchmarks.ray_bench import run_ray_bench

    try:
        run_ray_bench(
            passages=passages, items=items, max_new_tokens=max_new_tokens, batch_size=batch_size,
            workers=workers, address=ray_address, out_dir=out,
        )
    except (ValueError, ImportError) as err:
        fail(str(err))
    console.print((out / "ray.md").read_text())


@bench_app.command("keys")
def keys(
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
    from nest_benchmarks.key_bench import QUERY_MODES, run_key_bench
    from nest_integrations.store.key_codec import parse_spec

    try:
        [parse_spec(codec) for codec in comma_list(codecs)]
    except ValueError as err:
        fail(f"--codecs: {err}")
    if not comma_list(queries) or set(comma_list(queries)) - set(QUERY_MODES):
        fail(f"--queries takes {', '.join(QUERY_MODES)}, got {queries!r}")
    index = load_index(datastore)
    try:
        run_key_bench(
            index, codecs=comma_list(codecs), n=n, seed=seed,
            max_new_tokens=max_new_tokens, sample_passages=sample_passages,
            query_modes=comma_list(queries), out_dir=out,
        )
    except ValueError as err:
        fail(str(err))
    console.print((out / "key_bench.md").read_text())


@bench_app.command("store")
def store(
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
    from nest_benchmarks.store_bench import INTEGRATIONS, README_CHUNK_SIZE, README_MAX_NEW_TOKENS, run_store_bench

    chosen = comma_list(integrations)
    if not chosen or set(chosen) - set(INTEGRATIONS):
        fail(f"--integrations takes some of {', '.join(INTEGRATIONS)}, got {integrations!r}")
    if reuse_stores and store_dir is None:
        fail("--reuse-stores needs --store-dir")
    run_store_bench(
        out_dir=out, n=n, seed=seed, integrations=chosen, chunk_size=chunk_size or README_CHUNK_SIZE,
        max_new_tokens=max_new_tokens or README_MAX_NEW_TOKENS, rag_max_new_tokens=rag_max_new_tokens,
        store_dir=store_dir, reuse_stores=reuse_stores,
    )
    console.print((out / "table.md").read_text())


@bench_app.command("gate")
def gate(
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder of the people summaries (default: the demo index)."),
    n: int = typer.Option(200, min=1, help="Biographies (people of the index)."),
    seed: int = typer.Option(1, help="Sampling seed of the people."),
    k: int = typer.Option(8, min=1, help="First-stage passages per query."),
    out: Path = typer.Option(Path("runs/bench-gate"), help="Output folder (gate.json, gate.md)."),
) -> None:
    """What the relevance gate keeps for biographies, with the summary present and removed (no generation)."""
    from nest_benchmarks.gate_bench import gate_report

    index = load_index(datastore)
    try:
        gate_report(index, n=n, seed=seed, k=k, out_dir=out)
    except ValueError as err:
        fail(str(err))
    console.print((out / "gate.md").read_text())


WINDOW_DOMAINS = ("markdown-docs", "markdown-docs-pino", "docs", "wiki-qa-hard", "wiki-qa")
"""The question domains ``nest bench windows`` runs on (those with gold answers and a built-in index)."""


@bench_app.command("windows")
def windows(
    domains: list[str] = typer.Option(
        ["markdown-docs"], "--domain", metavar="DOMAIN", help=f"A question domain ({', '.join(WINDOW_DOMAINS)}); repeat for several."
    ),
    max_new_tokens: Optional[int] = typer.Option(
        None, min=1, help="Token budget the planned windows are cut at (default: nest eval's for the domains, 64)."
    ),
    limit: Optional[int] = typer.Option(None, min=1, help="Questions per domain (default: as nest eval, every one but wiki-qa's 100)."),
    seed: int = typer.Option(0, help="Sampling seed of the questions (with --limit, and for wiki-qa)."),
    docs_chunking: str = typer.Option(
        "cli", help="How the documentation domains are chunked, as in nest eval: 'cli', 'splitter' (LangChain's default "
        "splitter) or, for the Markdown domains, 'sentence' (LlamaIndex's default SentenceSplitter).",
    ),
    out: Path = typer.Option(Path("runs/bench-windows"), help="Output folder (windows.json, README.md)."),
) -> None:
    """Whether the gold answer is in the answer windows the decoder plans to copy, per domain: the
    first stage, the relevance gate and the window plan as in the decoder, no generation."""
    from nest_benchmarks.runner import DOCS_DOMAIN_CHUNKINGS, docs_domain_passages, load_items, run_config
    from nest_benchmarks.tasks import TASK_MAX_NEW_TOKENS
    from nest_benchmarks.window_bench import domain_report, write_window_bench

    if unknown := [d for d in domains if d not in WINDOW_DOMAINS]:
        fail(f"unknown --domain {', '.join(unknown)}; choose from {', '.join(WINDOW_DOMAINS)}")
    if len(set(domains)) != len(domains):
        fail(f"--domain repeats: {', '.join(domains)}")
    if bad := [d for d in domains if d in DOCS_DOMAIN_CHUNKINGS and docs_chunking not in DOCS_DOMAIN_CHUNKINGS[d]]:
        fail(f"unknown --docs-chunking {docs_chunking!r} for {', '.join(bad)}; choose from {', '.join(DOCS_DOMAIN_CHUNKINGS[bad[0]])}")
    config = run_config(None, max_new_tokens or max(TASK_MAX_NEW_TOKENS[d] for d in domains))
    reports, model = {}, ""
    for domain in domains:
        folder = docs_index(domain, docs_chunking, docs_domain_passages(domain, docs_chunking)) if domain in DOCS_DOMAIN_CHUNKINGS else None
        index = load_index(folder)
        try:
            items = load_items(domain, limit, seed=seed, passages=index.passages)
        except ValueError as err:
            fail(f"{domain}: {err}")
        reports[domain] = {"passages": len(index.passages), **domain_report(index, items, config)}
        model = index.lm.name
    write_window_bench(reports, config, model, out)
    console.print((out / "README.md").read_text())


@bench_app.command("device")
def device(
    models: str = typer.Option("default,gemma-3-270m", help="Comma-separated LMs: embedded names, local folders or hub ids available offline."),
    device: str = typer.Option("cuda", help="Where to run: cuda, cuda:<i>, mps or cpu."),
    dtypes: str = typer.Option("float16,bfloat16", help="Comma-separated dtypes: float32, float16, bfloat16."),
    n: int = typer.Option(8, min=1, help="Timed biography prompts per model and dtype (one more runs untimed first)."),
    max_new_tokens: int = typer.Option(96, min=1, help="Tokens per generation."),
    passages: int = typer.Option(300, min=1, help="Wikipedia summaries about people to index (keys precomputed on the device)."),
    out: Path = typer.Option(Path("runs/device-bench"), help="Output folder (device_bench.json, device_bench.md)."),
) -> None:
    """NEST (base and nest modes) against the LM's own greedy generate, per model and dtype, on a device."""
    from nest_benchmarks.device_bench import check_device, check_dtypes, run_device_bench

    if not comma_list(models):
        fail("--models is empty")
    try:
        check_dtypes(comma_list(dtypes))
    except ValueError as err:
        fail(f"--dtypes: {err}")
    try:
        check_device(device)
    except ValueError as err:
        fail(f"--device: {err}")
    try:
        run_device_bench(
            models=comma_list(models), device=device, dtypes=comma_list(dtypes), n=n,
            max_new_tokens=max_new_tokens, passages=passages, out_dir=out,
        )
    except ValueError as err:
        fail(str(err))
    console.print((out / "device_bench.md").read_text())


@bench_app.command("startup")
def startup(
    prompt: str = typer.Option("Tell me a bio of Marie Curie.", help="The prompt each run of nest generate answers."),
    runs: int = typer.Option(3, min=1, help="Warm runs (the cold run is one more, first)."),
    max_new_tokens: int = typer.Option(128, min=1, help="nest generate --max-new-tokens."),
    cold: bool = typer.Option(True, "--cold/--no-cold", help="Also time a run with the converted LM and its fingerprint not yet cached."),
    served: bool = typer.Option(True, "--served/--no-served", help="Also time runs answered by a `nest serve` of the index (started once)."),
    out: Path = typer.Option(Path("runs/startup"), help="Output folder (startup.json, startup.md)."),
) -> None:
    """Start-up of `nest generate` over the default index, each run a fresh process: cold (the
    converted LM and its fingerprint rebuilt in a fresh cache), warm, per phase, and served (a
    `nest serve` of the index answers)."""
    from nest_benchmarks.startup_bench import run_startup_bench

    try:
        run_startup_bench(
            prompt=prompt, runs=runs, max_new_tokens=max_new_tokens, cold=cold, served=served, out_dir=out,
            index_folder=default_index_path(), trace_variables=(STARTUP_TRACE_ENV, STARTUP_T0_ENV),
        )
    except (ValueError, RuntimeError) as err:
        fail(str(err))
    console.print((out / "startup.md").read_text())
