"""The ``nest`` command: build indexes, retrieve, generate, chat, evaluate, benchmark, calibrate.

One module per command group: :mod:`.index` (``nest index ...``, ``retrieve``, ``calibrate``),
:mod:`.generate` (``generate``, ``demo``), :mod:`.serve` (``serve``, a resident process that
``generate`` answers through, over the transport in :mod:`.served`), :mod:`.chat`,
:mod:`.evaluate` (``eval``) and :mod:`.bench` (``nest bench ...``); :mod:`.common` holds what
they share. Every command runs offline on the embedded defaults unless told otherwise, and
imports its heavy libraries only when it runs.
"""

from __future__ import annotations

import typer

from . import bench, chat, evaluate, generate, index, serve
from .common import setup_logging, skip_final_collections

app = typer.Typer(help="NEST: attributed, retrieval-grounded generation.", no_args_is_help=True, add_completion=False)
app.add_typer(index.index_app, name="index")
for module in (index, generate, serve, chat, evaluate, bench):
    app.add_typer(module.app)
app.add_typer(bench.bench_app, name="bench")


@app.callback()
def quiet_by_default(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show INFO logs and model-loading bars for any command."),
) -> None:
    """NEST: attributed, retrieval-grounded generation."""
    setup_logging(verbose)
    skip_final_collections()


def main() -> None:  # pragma: no cover
    app()
