"""What the measurement scripts under ``results/`` and ``benchmarks/`` share: their ``--domain``
arguments, the files they write, and the ``items.jsonl`` of a ``nest eval`` run they read.

Each script measures some sets named on its command line, ``--domain NAME=A:B`` (an index folder
and a question set, or a run folder...), and writes what it measured twice: ``STEM.json`` for
programs and ``STEM.md``, a Markdown table, for the docs that cite it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

__all__ = ["domain_parser", "domain_specs", "markdown_table", "read_run_items", "score_before_after", "write_report"]

Index = TypeVar("Index")
Score = TypeVar("Score")


def domain_parser(description: str | None, domain_help: str, **parser_options: Any) -> argparse.ArgumentParser:
    """A parser with ``--domain`` (repeated, required; ``domain_help`` says its fields) and
    ``--out`` (the folder the report goes to); a script adds its own options to it.
    ``parser_options`` go to ``argparse.ArgumentParser`` (a ``formatter_class``)."""
    parser = argparse.ArgumentParser(description=description, **parser_options)
    parser.add_argument("--domain", action="append", required=True, help=domain_help)
    parser.add_argument("--out", type=Path, required=True)
    return parser


def domain_specs(specs: Iterable[str]) -> dict[str, list[str]]:
    """``["attrs=IDX/attrs:qa.jsonl"]`` -> ``{"attrs": ["IDX/attrs", "qa.jsonl"]}``: each spec's
    name, and what follows the ``=`` split at every colon (no path here holds one).

    Raises:
        ValueError: a spec without ``=``, naming the spec.
    """
    domains: dict[str, list[str]] = {}
    for spec in specs:
        name, equals, rest = spec.partition("=")
        if not equals or not name:
            raise ValueError(f"--domain {spec!r}: expected NAME=FIELD:FIELD...")
        domains[name] = rest.split(":")
    return domains


def score_before_after(
    specs: Iterable[str], load_index: Callable[[str], Index], score_run: Callable[[Index, Path], Score]
) -> dict[str, dict[str, Score]]:
    """What a change did to the stored answers of some domains, scored without generating: for each
    ``NAME=INDEX:BEFORE:AFTER`` spec (:func:`domain_specs`; BEFORE and AFTER are the runs before
    and after the change), ``{NAME: {"before": score_run(index, BEFORE), "after": score_run(index,
    AFTER)}}`` in the order given, ``index = load_index(INDEX)`` loaded once a domain.

    Raises:
        ValueError: a spec without ``=`` or without three fields, naming the spec.
    """
    report: dict[str, dict[str, Score]] = {}
    for name, fields in domain_specs(specs).items():
        if len(fields) != 3:
            raise ValueError(f"--domain {name}={':'.join(fields)}: expected NAME=INDEX:BEFORE:AFTER")
        index_path, before, after = fields
        index = load_index(index_path)
        report[name] = {"before": score_run(index, Path(before)), "after": score_run(index, Path(after))}
    return report


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table, one line a row, ending in a line break; an empty cell is written ``| |``."""
    def line(cells: Sequence[Any]) -> str:
        return "|" + "".join(f" {cell} |" if str(cell) else " |" for cell in cells)

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in rows)]) + "\n"


def write_report(out: Path, stem: str, report: Any, table: str, *, indent: int = 1) -> None:
    """Write ``out/STEM.json`` (``report``) and ``out/STEM.md`` (``table``), creating ``out``, and
    print the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=indent) + "\n")
    (out / f"{stem}.md").write_text(table)
    print(table)


def read_run_items(run: Path) -> dict[tuple[str, str, str], dict]:
    """``(item_id, mode, condition) -> item record`` of one ``nest eval`` run folder's ``items.jsonl``."""
    with (run / "items.jsonl").open(encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines]
    return {(r["item_id"], r["mode"], r["condition"]): r for r in records}
