"""How answers end where the token budget ends them, before and after a change, from stored runs
without generating.

For each domain, the answers of two runs of ``nest eval`` on the same items (``items.jsonl`` in a
run folder), each mode both ran on its own: how many ended at the budget (``finish_reason`` ``length``),
how many of those end on a fragment (:func:`ends_on_fragment`: the last line that shows anything
is prose and does not end in a sentence's punctuation), the answers whose text changed, their
mean length in tokens before and after, and those whose text holds a gold answer before and not
after or the other way round.

    python results/whole-sentences-at-the-budget/endings.py --out results/whole-sentences-at-the-budget \\
        --domain yargs=results/answered-at-the-budget/every-domain/yargs:results/whole-sentences-at-the-budget/every-domain/yargs ...

A domain is ``NAME=BEFORE:AFTER`` (run folders). Writes ``endings.json`` and ``endings.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nest_benchmarks.metrics import answer_recall
from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, read_run_items, write_report
from nest_integrations.corpus.markdown_structure import ends_in_code

SENTENCE_END = (".", "!", "?", ":", ";")
"""Characters a whole sentence, or a line that announces what follows, ends in."""

CLOSING_MARKS = "\"')]*_`\u201d\u2019"
"""Closing quotes, brackets and emphasis marks read past at a line's end ("... (`--fail-under`)." ends in ".")."""


def ends_on_fragment(text: str) -> bool:
    """Whether an answer's last line that shows anything is prose that does not end a sentence:
    not a line of a code block (:func:`~nest_integrations.corpus.markdown_structure.ends_in_code`)
    nor a fence, and, closing marks aside, not ending in :data:`SENTENCE_END`. A list item
    written without a period counts as a fragment too: the count is an upper bound."""
    shown = text.rstrip()
    if not shown or ends_in_code(shown):
        return False
    last = shown.rsplit("\n", 1)[-1].strip()
    if last.startswith(("```", "~~~")):
        return False
    return not last.rstrip(CLOSING_MARKS).endswith(SENTENCE_END)


def _holds_gold(item: dict) -> bool | None:
    answers = item["meta"].get("answers") or []
    return bool(answer_recall(item["output"]["text"], answers)) if answers else None


def compare(before: Path, after: Path) -> dict[str, dict]:
    """Per mode: answers, those ending at the budget and on a fragment before and after, and the
    answers whose text changed (their tokens before and after, and gold answers gained or lost)."""
    then, now = read_run_items(before), read_run_items(after)
    modes: dict[str, dict] = {}
    for key, old in then.items():
        new = now.get(key)
        if new is None:
            continue  # a mode the run after did not repeat
        mode = modes.setdefault(key[1], {
            "answers": 0, "length_before": 0, "length_after": 0, "fragment_before": 0, "fragment_after": 0,
            "length_fragment_before": 0, "length_fragment_after": 0, "changed": [],
        })
        mode["answers"] += 1
        for side, item in (("before", old), ("after", new)):
            cut = item["output"]["stats"]["finish_reason"] == "length"
            fragment = ends_on_fragment(item["output"]["text"])
            mode[f"length_{side}"] += cut
            mode[f"fragment_{side}"] += fragment
            mode[f"length_fragment_{side}"] += cut and fragment
        if old["output"]["text"] != new["output"]["text"]:
            mode["changed"].append({
                "item": key[0], "condition": key[2],
                "tokens_before": old["output"]["stats"]["new_tokens"], "tokens_after": new["output"]["stats"]["new_tokens"],
                "reason_before": old["output"]["stats"]["finish_reason"], "reason_after": new["output"]["stats"]["finish_reason"],
                "gold_before": _holds_gold(old), "gold_after": _holds_gold(new),
                "ending_before": old["output"]["text"].rstrip()[-60:], "ending_after": new["output"]["text"].rstrip()[-60:],
            })
    return modes


def main() -> None:
    args = domain_parser(__doc__, "NAME=BEFORE:AFTER", formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    report = {name: compare(Path(before), Path(after)) for name, (before, after) in domain_specs(args.domain).items()}
    rows = []
    for name, modes in report.items():
        for mode, m in modes.items():
            changed = m["changed"]
            mean = lambda field: round(sum(c[field] for c in changed) / len(changed), 1) if changed else "–"  # noqa: E731
            lost = [c["item"] for c in changed if c["gold_before"] and not c["gold_after"]]
            gained = [c["item"] for c in changed if c["gold_after"] and not c["gold_before"]]
            rows.append([
                name, mode, m["answers"], f"{m['length_before']} / {m['length_after']}",
                f"{m['length_fragment_before']} / {m['length_fragment_after']}", f"{m['fragment_before']} / {m['fragment_after']}",
                len(changed), f"{mean('tokens_before')} / {mean('tokens_after')}",
                ", ".join(f"`{i}`" for i in gained) or "–", ", ".join(f"`{i}`" for i in lost) or "–",
            ])
    header = [
        "domain", "mode", "answers", "ended by the budget (before / after)", "of them on a fragment", "all answers on a fragment",
        "text changed", "their tokens (before / after)", "gold answer gained", "gold answer lost",
    ]
    write_report(args.out, "endings", report, markdown_table(header, rows))


if __name__ == "__main__":
    main()
