"""Compare two ``nest eval`` runs item by item: which texts are the same, which differ in white
space only, which only go on past the earlier text's end, which differ otherwise, and which
items gain or lose answer recall.

    python benchmarks/item_by_item.py \
        results/answer-windows-two-and-three/two-windows results/answer-windows-two-and-three/three-windows

Each argument is a folder of run folders (one per domain, each holding ``items.jsonl``); domains
present in both are compared, per mode and condition. Writes a Markdown table to stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nest_benchmarks.report_files import read_run_items


def compare(before: dict, after: dict) -> dict[tuple[str, str], dict]:
    """Per ``(mode, condition)``: counts of same / white-space-only / extended / other texts and of
    recall gains and losses, with the ids of the items whose text differs otherwise."""
    table: dict[tuple[str, str], dict] = {}
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            continue
        row = table.setdefault(key[1:], {"n": 0, "same": 0, "space": 0, "extended": 0, "other": [], "gained": 0, "lost": 0})
        old_text, new_text = old["output"]["text"], new["output"]["text"]
        row["n"] += 1
        if old_text == new_text:
            row["same"] += 1
        elif "".join(old_text.split()) == "".join(new_text.split()):
            row["space"] += 1
        elif new_text.startswith(old_text.rstrip()):
            row["extended"] += 1
        else:
            row["other"].append(key[0])
        old_recall, new_recall = old["metrics"].get("answer_recall"), new["metrics"].get("answer_recall")
        if old_recall is not None and new_recall is not None:
            row["gained"] += new_recall > old_recall
            row["lost"] += new_recall < old_recall
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="folder of the earlier run folders")
    parser.add_argument("after", type=Path, help="folder of the later run folders")
    args = parser.parse_args()
    print("| domain | mode | condition | items | same text | white space only | text goes on | other text | recall gained | recall lost |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    domains = sorted(p.name for p in args.after.iterdir() if (args.before / p.name / "items.jsonl").exists())
    for domain in domains:
        table = compare(read_run_items(args.before / domain), read_run_items(args.after / domain))
        for (mode, condition), row in sorted(table.items()):
            others = ", ".join(f"`{item}`" for item in row["other"]) or "–"
            print(
                f"| {domain} | {mode} | {condition} | {row['n']} | {row['same']} | {row['space']} | {row['extended']} "
                f"| {len(row['other'])} ({others}) | {row['gained']} | {row['lost']} |"
            )


if __name__ == "__main__":
    main()
