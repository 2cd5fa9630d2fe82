"""What the ``nest`` commands share: the consoles, failing, logging, option parsing, the
default index and the documentation domains' indexes, the check that the benchmarks project is
installed (``nest eval``, ``nest bench``), and the start-up trace that ``nest bench startup`` reads.

Imports only what every command needs (typer, rich): each command imports its own
libraries (torch, transformers, FAISS...) when it runs, so ``nest --help`` or a
command that fails on its options starts in a fraction of a second.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, NoReturn, Optional, Sequence

import typer
from rich.console import Console

if TYPE_CHECKING:  # pragma: no cover - run time needs no passage class here
    from nest_integrations.corpus.passages import Passage

console = Console()
err_console = Console(stderr=True)

DEMO_INDEX_NAME = "wiki-people-default"
DEMO_TOPIC = "People"

STARTUP_TRACE_ENV = "NEST_STARTUP_TRACE"
"""Environment variable: a file path where a command writes its start-up trace (JSON)."""
STARTUP_T0_ENV = "NEST_STARTUP_T0"
"""Environment variable: the Unix time (s) the process was started at, the trace's origin."""


def default_index_path(model: Optional[str] = None) -> Path:
    """Where ``nest demo`` / ``nest eval`` keep the default index: the 1,828 Wikipedia
    summaries of the topic People (the biography task's corpus), one folder per LM."""
    from nest_integrations.model.lm import cache_dir

    return cache_dir() / "indexes" / f"{DEMO_INDEX_NAME}{model_tag(model)}"


def model_tag(model: Optional[str]) -> str:
    """Suffix of the cached index folders built for ``model``: none for the default LM."""
    from nest_integrations.model.lm import embedded_model, is_default_lm

    if model is None or is_default_lm(model):
        return ""
    embedded = embedded_model(model)
    return "-" + (embedded.cache_name if embedded else re.sub(r"[^A-Za-z0-9_.-]+", "_", model))


def fail(message: str, *, one_line: bool = False) -> NoReturn:
    """Print ``error: message`` to stderr and exit with status 2; ``one_line``: unwrapped at the
    console's width (a command to copy stays whole)."""
    err_console.print(f"[red]error:[/red] {message}", soft_wrap=one_line)
    raise typer.Exit(code=2)


BENCHMARKS_PACKAGE = "nest_benchmarks"
"""The benchmarks project's package (the repository's ``benchmarks/``): the tasks, metrics, runner
and benches that ``nest eval`` and ``nest bench`` run, and the documents they run on."""
BENCHMARKS_INSTALL = "pip install -e benchmarks"
"""The command that installs it, from the repository's root (``make setup`` runs it)."""


def require_benchmarks(command: str) -> None:
    """Fail, in one line naming :data:`BENCHMARKS_INSTALL`, unless :data:`BENCHMARKS_PACKAGE` can
    be imported: the library does not ship it, and ``command`` (``nest eval``, ``nest bench``)
    imports it when it runs."""
    if importlib.util.find_spec(BENCHMARKS_PACKAGE) is None:
        fail(f"`{command}` runs the benchmarks project, which is not installed: `{BENCHMARKS_INSTALL}` "
             "from the repository's root installs it", one_line=True)


def setup_logging(verbose: bool) -> None:
    """Warnings only, and no weight-loading bars, unless ``verbose``: then INFO logs, the DEBUG lines
    libraries turn on for themselves (bm25s does at import) and transformers' loading bars.

    The bars are switched through huggingface_hub, which transformers reads when it is
    imported: importing transformers here would cost every command a second."""
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    handler = logging.StreamHandler()
    handler.setLevel(logging.NOTSET if verbose else logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)
    (enable_progress_bars if verbose else disable_progress_bars)()
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:  # already imported (a test, or a command run twice in one process)
        (hf_logging.enable_progress_bar if verbose else hf_logging.disable_progress_bar)()


def skip_final_collections() -> None:
    """Have this process, when it exits, leave its objects to the operating system instead of
    collecting them (once per process; commands call it through the ``nest`` callback).

    The interpreter's shutdown runs the cyclic garbage collector over every object still alive,
    several times: once torch and transformers are loaded, hundreds of thousands of them, most of
    the time between a command's output and its exit (``nest bench startup``, docs/serving.md),
    only to free memory the operating system takes back anyway. ``gc.freeze()``, in an atexit
    handler, puts them out of its reach. Nothing the command wrote is lost: the atexit handlers
    registered after this one (the batching service's, which lets the rows in flight finish,
    torch's) run before it and those registered before (logging's, which flushes and closes the
    handlers) after it, as usual; the interpreter still flushes stdout and stderr and still
    finalizes every object that reference counting frees (the project writes its files in
    ``with`` blocks); only objects kept alive by reference cycles alone are not finalized, which
    Python does not promise at exit either. Unlike ``os._exit``, exit codes and buffered output are
    as before.
    """
    global _final_collections_skipped
    if not _final_collections_skipped:
        atexit.register(gc.freeze)
        _final_collections_skipped = True


_final_collections_skipped = False


def comma_list(text: str) -> list[str]:
    """The non-empty, stripped items of a comma-separated option value."""
    return [item.strip() for item in text.split(",") if item.strip()]


def numbers(text: str, kind: type, option: str) -> list[Any]:
    """The comma-separated numbers of an option value, each parsed by ``kind`` (int or float);
    a value that does not parse fails the command naming ``option``, before any work."""
    try:
        return [kind(item) for item in comma_list(text)]
    except ValueError:
        fail(f"{option} takes comma-separated {kind.__name__}s, got {text!r}")


def positive(value: Optional[float]) -> Optional[float]:
    """Option callback: a float option must be above 0 (click's ranges cannot exclude 0)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be above 0, got {value:g}")
    return value


def given(ctx: typer.Context, *names: str) -> list[str]:
    """The options among the parameters ``names`` that the command line (or environment) set, as
    their flags: to refuse an option that does not apply rather than ignore it silently."""
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    sources = {name: ctx.get_parameter_source(name) for name in names}  # click's ParameterSource (typer vendors click)
    return [flags[name] for name, source in sources.items() if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")]


class StartupTrace:
    """Start-up phases of one command, written as JSON to ``$NEST_STARTUP_TRACE`` when it is set
    (``nest bench startup`` sets it for the processes it starts); inert otherwise.

    Times are seconds: ``phases`` the duration of each phase, ``marks`` the moments since
    ``$NEST_STARTUP_T0`` (the process's start, as its parent saw it; else the trace's creation).
    """

    def __init__(self) -> None:
        self.path = os.environ.get(STARTUP_TRACE_ENV) or None
        self.t0 = float(os.environ.get(STARTUP_T0_ENV) or time.time())
        self.phases: dict[str, float] = {}
        self.marks: dict[str, float] = {}

    @property
    def active(self) -> bool:
        return self.path is not None

    def mark(self, name: str) -> None:
        """Record that ``name`` happened now (the first time only)."""
        if self.active:
            self.marks.setdefault(name, time.time() - self.t0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as the phase ``name`` (added up over repeated blocks)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.active:
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started

    def write(self) -> None:
        if self.active:
            self.mark("end")
            Path(str(self.path)).write_text(json.dumps({"phases": self.phases, "marks": self.marks}, indent=2), encoding="utf-8")


trace = StartupTrace()
"""This process's start-up trace."""


def load_index(path: Optional[Path], model: Optional[str] = None) -> Any:
    """The index at ``path`` (None: the default index, built into the cache once), decoding with
    ``model`` (None: the LM it was built with); a refused index fails the command."""
    from nest_integrations.index.nest_index import NestIndex
    from nest_integrations.model.lm import load_lm

    folder = path or default_index_path(model)
    if path is None and not (folder / "manifest.json").exists():
        build_default_index(folder, model)
    if trace.active:  # each library in a phase of its own, in the order loading needs them
        with trace.phase("imports"):  # transformers' model classes too: the LM and the embedder share them
            import torch  # noqa: F401
            import transformers.modeling_utils  # noqa: F401
        if _default_embedder(folder):
            from nest_integrations.retrieval import load_embedder

            with trace.phase("embedder"):  # cached per process: the index loads this one below
                load_embedder()
    try:
        with trace.phase("index"):
            index = NestIndex.load(folder, load_lm(model) if model else None)
    except ValueError as err:
        fail(str(err))
    if trace.active:
        trace.phases["lm"] = index.lm.load_s or 0.0
        trace.phases["index"] -= trace.phases["lm"]
    return index


def _default_embedder(folder: Path) -> bool:
    """Whether the index at ``folder`` embeds queries with the bundled MiniLM."""
    try:
        return json.loads((folder / "dense.json").read_text(encoding="utf-8")).get("embedder_kind") == "default"
    except (OSError, ValueError):
        return False


def build_default_index(folder: Path, model: Optional[str] = None) -> None:
    """Build the default index (:data:`DEMO_TOPIC` Wikipedia summaries) into ``folder``."""
    from nest_integrations.corpus.loaders import load_wikipedia_summaries
    from nest_integrations.index.nest_index import NestIndex
    from nest_integrations.model.lm import load_lm

    console.print(f"Building the default index over the Wikipedia summaries about people in {folder} (once)...")
    index = NestIndex.build(load_wikipedia_summaries(topic=DEMO_TOPIC), load_lm(model or "default"))
    index.save(folder)


def passages_fingerprint(passages: Sequence[Passage]) -> str:
    """12 hex digits of SHA-256 over the passages' ids, texts and metadata, in order: a cached
    index named with it is rebuilt when the documents, their chunking or what they say of their
    files (the metadata citations read) change."""
    digest = hashlib.sha256()
    for passage in passages:
        metadata = json.dumps(passage.metadata, sort_keys=True, default=str)
        digest.update(f"{len(passage.id)}:{passage.id}{len(passage.text)}:{passage.text}{len(metadata)}:{metadata}".encode())
    return digest.hexdigest()[:12]


def docs_index(task: str, chunking: str, passages: Sequence[Passage], model: Optional[str] = None) -> Path:
    """The folder of a documentation domain's default index over ``passages`` (the benchmarks
    project's ``nest_benchmarks.runner.docs_domain_passages(task, chunking)``, which ``nest eval``
    and ``nest bench`` pass), built into the cache once per version of its passages."""
    from nest_integrations.index.nest_index import NestIndex
    from nest_integrations.model.lm import cache_dir, load_lm

    folder = cache_dir() / "indexes" / f"{task}-{chunking}-{passages_fingerprint(passages)}{model_tag(model)}"
    if not (folder / "manifest.json").exists():
        console.print(f"Building the {task} index ({len(passages)} passages, {chunking}) in {folder} (once)...")
        NestIndex.build(passages, load_lm(model or "default")).save(folder)
    return folder
