"""The ``nest`` command: build indexes, retrieve, generate, chat, evaluate, benchmark, calibrate.

One module per command group: :mod:`.index` (``nest index ...``, ``retrieve``, ``calibrate``),
:mod:`.generate` (``generate``, ``demo``), :mod:`.serve` (``serve``, a resident process that
``generate`` answers through, over the transport in :mod:`.server_transport`), :mod:`.chat` (its terminal
session in :mod:`.chat_session`),
:mod:`.evaluate` (``eval``), :mod:`.bench` (``nest bench ...``) and :mod:`.models` (``nest models
install``, the embedded LMs' packages); :mod:`.common` holds what
they share. Every command runs offline on the embedded defaults unless told otherwise, and
imports its heavy libraries only when it runs.
"""

from __future__ import annotations

import sys

import typer

from nest_integrations.model.lm import MissingModelPackage

from . import bench, chat, evaluate, generate, index, models, serve
from .common import err_console, setup_logging, skip_final_collections

app = typer.Typer(help="NEST: attributed, retrieval-grounded generation.", no_args_is_help=True, add_completion=False)
app.add_typer(index.index_app, name="index")
for module in (index, generate, serve, chat, evaluate):
    app.add_typer(module.app)
app.add_typer(bench.bench_app, name="bench")
app.add_typer(models.models_app, name="models")


@app.callback()
def quiet_by_default(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show INFO logs and model-loading bars for any command."),
) -> None:
    """NEST: attributed, retrieval-grounded generation."""
    setup_logging(verbose)
    skip_final_collections()


def main() -> None:
    """The ``nest`` command: ``app``, except that a missing embedded LM package ends it with the
    command that installs it (exit status 2) rather than a traceback."""
    try:
        app()
    except MissingModelPackage as err:
        err_console.print(f"[red]error:[/red] {err}")
        sys.exit(2)
