"""Whether the lines an answer copies from a source's code read as code in the answer, without
generating: read from generated answers (``nest eval``'s ``items.jsonl``, or ``nest generate
--output`` JSONL) and the index they were copied from.

For each copied span, each of its lines that shows text and lies inside a code block of its
source (read with every chunk before it in its document: ``open_code_block``) is looked up in
the answer as a Markdown reader reads it (markdown-it, CommonMark): a line outside every fenced
or indented block there reads as prose, and the block's closing fence, copied after it, may
then open a block that swallows what follows.

    python results/code-blocks-across-chunks/code_lines_rendered.py --index IDX/attrs \\
        --items results/code-blocks-across-chunks/every-domain/attrs/items.jsonl

Prints, per file, the code lines copied and those read as prose, and the answers that hold any.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nest_benchmarks.code_rendering import code_lines_read_as_prose
from nest_integrations import NestIndex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="the index the answers copied from")
    parser.add_argument("--items", type=Path, nargs="+", required=True, help="items.jsonl or generation JSONL files")
    args = parser.parse_args()
    index = NestIndex.load(args.index)
    for path in args.items:
        total, as_prose, answers = 0, 0, []
        for line in path.read_text().splitlines():
            item = json.loads(line)
            output = item.get("output", item)
            copied, prose = code_lines_read_as_prose(index, output)
            total, as_prose = total + copied, as_prose + prose
            if prose:
                answers.append(item.get("item_id") or item.get("id"))
        print(f"{path}: {total} code lines copied, {as_prose} read as prose; answers: {', '.join(answers) or 'none'}")


if __name__ == "__main__":
    main()
