"""``nest eval``: the modes compared on the same items of a task, run by the benchmarks project
(``nest_benchmarks``, imported when the command runs; without it the command fails naming
its install command)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from nest_integrations.store.key_codec import CODEC_HELP
from .common import comma_list, console, docs_index, fail, load_index, require_benchmarks

app = typer.Typer()
"""The command of this module, merged into ``nest``."""

@app.command("eval")
def evaluate(
    task: str = typer.Option(
        "bio", help="bio, completion, qa, wiki-qa, wiki-qa-hard, docs, markdown-docs, markdown-docs-pino, or markdown-qa "
        "(your questions about your documents: --qa FILE in the documentation format, -d the index of the documents)."
    ),
    n: Optional[int] = typer.Option(None, min=1, help="Items per condition (default: 100; every question for qa and docs)."),
    seed: int = typer.Option(0, help="Sampling seed of the items."),
    datastore: Optional[Path] = typer.Option(
        None, "--datastore", "-d", help="Index folder (default: the demo index; for docs and markdown-docs(-pino) their own index)."
    ),
    modes: str = typer.Option("base,rag,knnlm,nest,ra_nest", help="Comma-separated modes."),
    max_new_tokens: Optional[int] = typer.Option(
        None, min=1, help="Tokens per generation (default: 64 for the bundled question sets, 256 for markdown-qa, 128 otherwise)."
    ),
    qa_path: Optional[Path] = typer.Option(None, "--qa", help="Questions JSONL (tasks qa and markdown-qa)."),
    docs_chunking: str = typer.Option(
        "cli", help="docs and markdown-docs(-pino) without -d: 'cli' (nest index build's default chunking), 'splitter' "
        "(LangChain's default splitter) or, for markdown-docs(-pino), 'sentence' (LlamaIndex's default SentenceSplitter).",
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
    nest eval --task markdown-docs [--docs-chunking splitter|sentence]; nest eval --task markdown-docs-pino.
    """
    require_benchmarks("nest eval")
    from nest_benchmarks.runner import DOCS_DOMAIN_CHUNKINGS, docs_domain_passages, run_eval
    from nest_benchmarks.tasks import FILE_TASKS, QA_TASKS, TASKS
    from nest_benchmarks.window_bench import write_funnel

    from nest_integrations.core.config import MODES

    if task not in TASKS:
        fail(f"unknown --task {task!r}; choose from {', '.join(TASKS)}")
    if not comma_list(modes) or set(comma_list(modes)) - set(MODES):
        fail(f"--modes takes some of {', '.join(MODES)}, got {modes!r}")
    if task in FILE_TASKS and qa_path is None:
        fail(f"--task {task} needs --qa FILE (a JSONL of {{\"question\", \"answers\"}})")
    if task == "markdown-qa" and datastore is None:
        fail("--task markdown-qa needs -d INDEX: the index of the documents the questions are about (nest index build)")
    if key_compression is not None:
        from nest_integrations.store.key_codec import parse_spec

        try:
            parse_spec(key_compression)
        except ValueError as err:
            fail(f"--key-compression: {err}")
    chunkings = DOCS_DOMAIN_CHUNKINGS.get(task, DOCS_DOMAIN_CHUNKINGS["docs"])
    if docs_chunking not in chunkings:
        fail(f"unknown --docs-chunking {docs_chunking!r} for {task}; choose from {', '.join(chunkings)}")
    if task in DOCS_DOMAIN_CHUNKINGS and datastore is None:
        datastore = docs_index(task, docs_chunking, docs_domain_passages(task, docs_chunking), model)
    index = load_index(datastore, model)
    try:
        if key_compression is not None:
            codec = index.datastore.train_codec(key_compression, sample_passages=codec_sample, seed=seed)
            console.print(f"Keys stored as {codec.spec} ({codec.bytes_per_key:,} B/token)")
        summary = run_eval(
            index, task, n=n, seed=seed, modes=tuple(comma_list(modes)),
            max_new_tokens=max_new_tokens, out_dir=out, qa_path=qa_path,
        )
        if task in QA_TASKS:
            write_funnel(index, summary, out, qa_path=qa_path)
    except ValueError as err:
        fail(str(err))
    console.print((out / "summary.md").read_text())
    if task in QA_TASKS:
        console.print((out / "funnel.md").read_text())
