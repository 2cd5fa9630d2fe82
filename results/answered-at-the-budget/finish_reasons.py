"""Why each answer ended, before and after a change, from stored runs without generating.

For each domain, the answers of two runs of ``nest eval`` on the same items (``items.jsonl`` in a
run folder), each mode on its own: how many ended with each ``finish_reason`` before and after,
and the answers whose reason changed, with their texts' lengths in tokens and whether the text is
the same.

    python results/answered-at-the-budget/finish_reasons.py --out results/answered-at-the-budget \\
        --domain yargs=results/title-labels-open-paragraphs/every-domain/yargs:results/answered-at-the-budget/every-domain/yargs ...

A domain is ``NAME=BEFORE:AFTER`` (run folders). Writes ``finish_reasons.json`` and ``finish_reasons.md``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, read_run_items, write_report


def changed_reasons(before: Path, after: Path) -> dict[str, dict]:
    """Per mode: the count of each reason ``before`` and ``after``, and the answers whose reason changed."""
    then, now = read_run_items(before), read_run_items(after)
    modes: dict[str, dict] = {}
    for key, item in then.items():
        mode = modes.setdefault(key[1], {"before": Counter(), "after": Counter(), "changed": []})
        old, new = item["output"], now[key]["output"]
        mode["before"][old["stats"]["finish_reason"]] += 1
        mode["after"][new["stats"]["finish_reason"]] += 1
        if old["stats"]["finish_reason"] != new["stats"]["finish_reason"]:
            mode["changed"].append({
                "item": key[0], "before": old["stats"]["finish_reason"], "after": new["stats"]["finish_reason"],
                "new_tokens": new["stats"]["new_tokens"], "same_text": old["text"] == new["text"],
            })
    return modes


def main() -> None:
    args = domain_parser(__doc__, "NAME=BEFORE:AFTER", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report: dict = {}
    rows = []
    for name, (before, after) in domain_specs(args.domain).items():
        report[name] = changed_reasons(Path(before), Path(after))
        for mode, reasons in report[name].items():
            counts = lambda c: ", ".join(f"{reason} {n}" for reason, n in sorted(c.items()))  # noqa: E731
            changed = "; ".join(
                f"`{c['item']}` {c['before']} -> {c['after']} ({c['new_tokens']} tokens, {'same' if c['same_text'] else 'other'} text)"
                for c in reasons["changed"]
            )
            rows.append([name, mode, sum(reasons["before"].values()), counts(reasons["before"]), counts(reasons["after"]), changed or "–"])
    header = ["domain", "mode", "answers", "finish reasons before", "after", "changed"]
    write_report(args.out, "finish_reasons", report, markdown_table(header, rows))


if __name__ == "__main__":
    main()
