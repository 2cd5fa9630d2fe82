"""Window recall with two and with three answer windows, on one question set and its saved index.

For each ``--answer-windows`` count, the first stage, the relevance gate and the window plan run
as in the decoder (``nest_benchmarks.window_bench.domain_report``, no generation) and the
planned text, cut at ``--max-new-tokens``, is checked for the gold answer. Writes
``windows-<count>.json`` per count (summary and items) under ``--out`` and prints one summary line
each. The bundled domains are named as in ``nest eval``; a Markdown question set is a JSONL file
(``benchmarks/domains/*/qa.jsonl``) over an index built from its documents:

    python results/window-bench/answer-windows/window_recall.py --index IDX/attrs \\
        --task markdown-qa --qa benchmarks/domains/attrs/qa.jsonl --out results/window-bench/answer-windows/attrs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_benchmarks.runner import load_items
from nest_benchmarks.window_bench import domain_report
from nest_integrations import NestConfig, NestIndex

SUMMARY_KEYS = ("answerable", "answer_retrieved", "answer_kept", "window_recall", "unanswerable", "unanswerable_kept")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", required=True, help="saved NestIndex folder")
    parser.add_argument("--task", required=True, help="markdown-qa, markdown-docs, markdown-docs-pino, docs or wiki-qa-hard")
    parser.add_argument("--qa", default=None, help="question JSONL for --task markdown-qa")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--answer-windows", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    index = NestIndex.load(args.index)
    items = load_items(args.task, None, passages=index.passages, qa_path=args.qa)
    args.out.mkdir(parents=True, exist_ok=True)
    for count in args.answer_windows:
        report = domain_report(index, items, NestConfig(max_new_tokens=args.max_new_tokens, answer_windows=count))
        (args.out / f"windows-{count}.json").write_text(json.dumps(report, indent=1, default=str))
        print(count, {key: report["summary"][key] for key in SUMMARY_KEYS})


if __name__ == "__main__":
    main()
