"""Count the answers that end where the repetition guard would cut their last copy, from stored runs
without generating.

An answer that ends ``answered`` on a copied span whose source goes on, not at a sentence's end or a
line's, is counted when the source's next tokens would complete a 4-gram the answer already holds
(:func:`~nest_integrations.policy.repetition.repeat_free_length` below 3 of them): the copy running
on was stopped by the guard there, not by the LM's check or the source.

    python results/run-on-copies-keep-their-repeats/repeat_cuts.py RUNS IDX yargs click attrs ...

``RUNS`` is a folder of run folders (``RUNS/<set>/items.jsonl``), ``IDX`` a folder of the indexes
they ran on (``IDX/<set>/passages.jsonl``). Prints, per set, the answers ending on a copy and the
counted ones, with the answer's last characters and the source's next ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from nest_integrations.model.lm import default_model_path
from nest_integrations.policy.copy_policy import ends_sentence
from nest_integrations.policy.repetition import repeat_free_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("indexes", type=Path)
    parser.add_argument("sets", nargs="+")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    total = 0
    for name in args.sets:
        with (args.indexes / name / "passages.jsonl").open(encoding="utf-8") as lines:
            sources = {record["id"]: record["text"] for record in map(json.loads, lines)}
        ending_on_a_copy, cut = 0, []
        with (args.runs / name / "items.jsonl").open(encoding="utf-8") as lines:
            for record in map(json.loads, lines):
                output = record["output"]
                if output["stats"]["finish_reason"] != "answered" or not output["spans"] or not output["spans"][-1].get("copied"):
                    continue
                ending_on_a_copy += 1
                last = output["spans"][-1]["source"]
                rest = sources[last["id"]][last["chunk_char_end"] : last["chunk_char_end"] + 200]
                if not rest.strip() or ends_sentence(output["text"].rstrip()) or output["text"].endswith("\n"):
                    continue
                held = tokenizer(output["text"], add_special_tokens=False)["input_ids"]
                following = tokenizer(rest, add_special_tokens=False)["input_ids"][:20]
                if repeat_free_length(held, following, 4) < 3:
                    cut.append((record["item_id"], output["text"][-40:], rest[:30]))
        total += len(cut)
        print(f"{name}: {ending_on_a_copy} answers end on a copy, {len(cut)} where the guard cuts it")
        for item_id, end, following_text in cut:
            print(f"    {item_id}: ...{end!r} | {following_text!r}")
    print(f"total: {total}")


if __name__ == "__main__":
    main()
