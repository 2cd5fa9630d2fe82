"""Score stored ``nest eval`` runs with the checks of the LM's own writing that read an answer
alone: which answers hold model text inside copied code, and which hold garbled model text.

    python benchmarks/output_checks.py results/refactor-same-text --out results/model-text-in-copied-code/this-release

The argument is a folder of run folders (one per domain, each holding ``items.jsonl``); every
item of every mode is read (``base`` and ``rag`` copy nothing, so no answer of theirs holds copied
code). A run made before a check existed is scored by it all the same: the checks need the
answer's text and spans, not its passages. Writes a Markdown table to stdout and, with ``--out``,
``output_checks.json`` and ``output_checks.md`` there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nest_benchmarks.metrics import garbled_model_text, model_text_in_code
from nest_benchmarks.report_files import markdown_table, read_run_items, write_report

CHECKS = {
    "model_text_in_code": lambda output: bool(model_text_in_code(output)),
    "garbled": lambda output: bool(garbled_model_text(output)),
}
"""Each check's name and whether an answer (``NestOutput.to_dict()``) fails it."""


def run_checks(runs: Path) -> dict[str, dict[str, dict]]:
    """``domain -> mode -> {"answers": n, check: answers failing it, "failing": {check: item ids}}``
    over every run folder of ``runs`` (conditions pooled)."""
    report: dict[str, dict[str, dict]] = {}
    for run in sorted(p for p in runs.iterdir() if (p / "items.jsonl").exists()):
        for (item_id, mode, _condition), record in read_run_items(run).items():
            row = report.setdefault(run.name, {}).setdefault(mode, {"answers": 0, **dict.fromkeys(CHECKS, 0), "failing": {}})
            row["answers"] += 1
            for name, fails in CHECKS.items():
                if fails(record["output"]):
                    row[name] += 1
                    row["failing"].setdefault(name, []).append(item_id)
    return report


def checks_table(report: dict[str, dict[str, dict]]) -> str:
    """One Markdown row per domain and mode: answers, then answers failing each check."""
    rows = [
        [domain, mode, row["answers"], *(row[name] for name in CHECKS)]
        for domain, modes in report.items()
        for mode, row in sorted(modes.items())
    ]
    return markdown_table(["domain", "mode", "answers", "model text in copied code", "garbled model text"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="folder of run folders, each holding items.jsonl")
    parser.add_argument("--out", type=Path, help="write output_checks.json and output_checks.md here")
    args = parser.parse_args()
    report = run_checks(args.runs)
    table = checks_table(report)
    if args.out is None:
        print(table)
    else:
        write_report(args.out, "output_checks", {"runs": str(args.runs), "checks": list(CHECKS), "domains": report}, table)


if __name__ == "__main__":
    main()
