"""Every stored abstention's "See also" line written again by this release's ``see_also``.

An abstention names the nearest sections of the passages the first stage retrieved; this release
names each document once, with its sections' titles in order (``Server.md (maxParamLength;
maxRequestsPerSocket)``), where it named the document once a section. Nothing else of the
abstention, and nothing of any other answer, depends on ``see_also``, so the stored runs are
scored without generating: for each answer that is an abstention, the retrieved passages
(``retrieved_ids``, read from the run's index) go through ``abstention_text`` and its "See also"
line is compared with the stored one. ``same sections`` checks that the new line names the stored line's
sections, each document once in order of its first section: the stored one grouped here by
document must equal the new one. The last columns count the abstentions the evaluation's
repetition check (a word 4-gram three times: ``nest_benchmarks.metrics.repeated_ngram``) reads
as a loop, with the stored line and with the new one.

    python results/see-also-one-entry-a-document/rerendered_abstentions.py \\
        --out results/see-also-one-entry-a-document \\
        --index IDX/attrs=IDX/attrs ... --index markdown-docs=IDX/markdown-docs-cli-a7cc94e37d42 \\
        --index markdown-docs:splitter=IDX/markdown-docs-splitter-7792a94de095 ... \\
        results/refactor-same-text/[!fp]*/ \\
        results/bundled-docs-named-by-file results/git-lfs-held-out/held-out results/git-lfs-held-out/off-topic

Arguments: run folders, or folders of them. ``results/refactor-same-text/[!fp]*/`` (its off-topic
runs included) leaves out its Fastify and Pino runs, which named every document by its package:
their re-run is ``results/bundled-docs-named-by-file``. ``--index KEY=PATH``: the index a run reads, keyed by
the ``-d`` value of its command, or by its task for a run over a bundled index (no ``-d``;
``TASK:splitter`` for the bundled corpus cut by LangChain's splitter). A run with abstentions and
no index given is counted as skipped. Writes ``rerendered_abstentions.json`` and
``rerendered_abstentions.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from nest_benchmarks.metrics import repeated_ngram
from nest_benchmarks.report_files import domain_specs, markdown_table, read_run_items, write_report
from nest_integrations import NestIndex
from nest_integrations.decoding.abstention import NOT_COVERED, abstention_text

_ENTRY = re.compile(r"^(?P<name>.*?)(?: \((?P<titles>.*)\))?$")


def see_also_line(text: str) -> str:
    """The "See also: ..." line of an abstention's text, "" when it has none."""
    return next((line for line in text.splitlines() if line.startswith("See also: ")), "")


def grouped(line: str) -> str:
    """A stored "See also" line with each document named once, its titles in order (an untitled
    entry of a document that has titled ones left out): what this release writes for the same
    sections."""
    titles: dict[str, list[str]] = {}
    for entry in line.removeprefix("See also: ").removesuffix(".").split("; ") if line else []:
        match = _ENTRY.match(entry)
        assert match is not None  # the pattern matches any string
        titles.setdefault(match["name"], []).extend([match["titles"]] if match["titles"] else [])
    entries = [f"{name} ({'; '.join(found)})" if found else name for name, found in titles.items()]
    return f"See also: {'; '.join(entries)}." if entries else ""


def run_key(summary: dict) -> str:
    """The ``-d`` value of a run's command, or its task when it has none (``TASK:CHUNKING`` with
    a ``--docs-chunking`` other than ``cli``: the bundled corpus cut another way)."""
    command = summary["command"]
    if match := re.search(r"(?:^| )-d (\S+)", command):
        return match.group(1)
    chunking = re.search(r"--docs-chunking (\w+)", command)
    return summary["task"] + (f":{chunking.group(1)}" if chunking and chunking.group(1) != "cli" else "")


def run_folders(paths: list[Path]) -> list[Path]:
    """Each path that is a run folder (it holds ``items.jsonl``), else the run folders in it."""
    runs = []
    for path in paths:
        runs += [path] if (path / "items.jsonl").exists() else sorted(p for p in path.iterdir() if (p / "items.jsonl").exists())
    return runs


def rerender(runs: list[Path], indexes: dict[str, str]) -> dict[str, dict]:
    """``run folder -> {"abstentions", "changed", "same_sections", "skipped", "examples"}`` over
    the ``runs`` that hold an abstention."""
    passages_of: dict[str, dict] = {}
    report: dict[str, dict] = {}
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        abstentions = [r for r in read_run_items(run).values() if r["output"]["text"].startswith(NOT_COVERED)]
        if not abstentions:
            continue
        row = {"abstentions": len(abstentions), "changed": 0, "same_sections": 0, "skipped": 0, "repeated_before": 0, "repeated_after": 0, "examples": []}
        report[str(run)] = row
        key = run_key(summary)
        if key not in indexes:
            row["skipped"] = len(abstentions)
            continue
        if key not in passages_of:
            passages_of[key] = {p.id: p for p in NestIndex.load(indexes[key]).passages}
        by_id = passages_of[key]
        for record in abstentions:
            stored = see_also_line(record["output"]["text"])
            new = see_also_line(abstention_text([by_id[i] for i in record["retrieved_ids"]]))
            row["same_sections"] += grouped(stored) == new
            text = record["output"]["text"]
            row["repeated_before"] += repeated_ngram(text)
            row["repeated_after"] += repeated_ngram(text.replace(stored, new) if stored else text)
            if new != stored:
                row["changed"] += 1
                if len(row["examples"]) < 3:
                    row["examples"].append({"item": record["item_id"], "stored": stored, "new": new})
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, or folders of them")
    parser.add_argument("--index", action="append", default=[], help="KEY=PATH: the index of the runs keyed KEY")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    indexes = {key: value[0] for key, value in domain_specs(args.index).items()}
    report = rerender(run_folders(args.runs), indexes)
    columns = ("abstentions", "skipped", "same_sections", "changed", "repeated_before", "repeated_after")
    rows = [[run, *(r[k] for k in columns)] for run, r in report.items()]
    totals = [sum(r[k] for r in report.values()) for k in columns]
    table = markdown_table(
        ["run", "abstentions", "skipped (no index)", "same sections, each document once", "line changed",
         "repetition check: before", "after"],
        [*rows, ["all", *totals]],
    )
    write_report(args.out, "rerendered_abstentions", report, table)


if __name__ == "__main__":
    main()
