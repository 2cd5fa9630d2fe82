"""Which corpora this change can touch, counted without generating: per corpus, the paragraphs
whose closing ``::`` is now partly hidden, the colon-fence lines now hidden, the places where
a run of hidden tokens ends a line (no line break in it, only white space after it up to the next
one), where a copy going on past it now copies the next line unchecked, and the hidden blocks
(not headings) with a block of text at the margin on the very next line, where a copy now opens
that block after a paragraph break (:func:`~nest_integrations.corpus.markdown_structure.below_hidden_line`).
A corpus with none of the four reads and decodes as before.

    python results/literal-markers-and-colon-fences/where_it_reads_otherwise.py --out results/literal-markers-and-colon-fences \\
        --domain borg=benchmarks/domains/heldout/borg/docs --domain fastify=@fastify ...

A domain is ``NAME=SOURCE``: a documentation folder (as ``nest index build`` loads it, whole
documents), or ``@fastify``, ``@pino``, ``@docs`` (the bundled question sets' documents) or
``@wiki`` (the Wikipedia summaries). Writes ``where_it_reads_otherwise.json`` and ``.md``.
"""

from __future__ import annotations

import re

import numpy as np

from nest_benchmarks.report_files import domain_parser, domain_specs, markdown_table, write_report
from nest_integrations.corpus.markdown_structure import below_hidden_line, copy_layout, copyable_tokens, parse_blocks
from nest_integrations.corpus.passages import Passage
from nest_integrations.model.lm import load_lm

COLON_FENCE = re.compile(r"^ {0,3}:{3,}", re.MULTILINE)


def documents(source: str) -> list[Passage]:
    """The documents of a ``--domain`` source (see the module docstring)."""
    if source in ("@fastify", "@pino"):
        from nest_benchmarks.markdown_docs import fastify_documents, pino_documents

        return fastify_documents() if source == "@fastify" else pino_documents()
    if source == "@docs":
        from nest_benchmarks.docs_corpus import docs_corpus

        return docs_corpus()
    from nest_integrations.corpus.loaders import load_corpus

    return load_corpus("wiki" if source == "@wiki" else source)


def line_end_markup(text: str, char_spans: np.ndarray) -> int:
    """How many runs of hidden tokens in ``text`` hold no line break and end their line."""
    visible, count, i = copyable_tokens(text, char_spans), 0, 0
    while i < len(visible):
        if visible[i]:
            i += 1
            continue
        j = i
        while j < len(visible) and not visible[j]:
            j += 1
        if 0 < i and j < len(visible):
            start, going_on = int(char_spans[i, 0]), int(char_spans[j, 0])
            line_end = text.find("\n", going_on)
            count += "\n" not in text[start:going_on] and line_end >= 0 and not text[going_on:line_end].strip()
        i = j
    return count


def blocks_under_hidden_lines(text: str) -> int:
    """How many blocks a copy opens after a paragraph break for the hidden block right above them."""
    return sum(below_hidden_line(text, block.end) > block.end for block in parse_blocks(text) if not block.copyable)


def count(source: str, tokenizer) -> dict[str, int]:
    closing = fences = line_ends = under = 0
    docs = documents(source)
    for doc in docs:
        layout = copy_layout(doc.text)
        if layout is None:
            continue
        closing += sum(doc.text[start:end].strip() in (":", "::") for start, end in layout.hidden)
        fences += sum(1 for m in COLON_FENCE.finditer(doc.text) if any(s <= m.start() < e for s, e in layout.hidden))
        encoded = tokenizer(doc.text, return_offsets_mapping=True, add_special_tokens=False)
        under += blocks_under_hidden_lines(doc.text)
        line_ends += line_end_markup(doc.text, np.asarray(encoded["offset_mapping"], dtype=np.int64).reshape(-1, 2))
    return {
        "documents": len(docs), "closing_colons_hidden": closing, "colon_fence_lines_hidden": fences,
        "markup_ending_a_line": line_ends, "blocks_under_a_hidden_line": under,
    }


def main() -> None:
    args = domain_parser(__doc__, "NAME=SOURCE").parse_args()
    tokenizer = load_lm("default").tokenizer
    report = {name: count(fields[0], tokenizer) for name, fields in domain_specs(args.domain).items()}
    keys = ("documents", "closing_colons_hidden", "colon_fence_lines_hidden", "markup_ending_a_line", "blocks_under_a_hidden_line")
    rows = [(name, *(r[key] for key in keys)) for name, r in report.items()]
    header = ("corpus", "documents", "closing :: hidden", "colon-fence lines hidden", "hidden markup ending a line", "blocks right under a hidden block")
    write_report(args.out, "where_it_reads_otherwise", report, markdown_table(header, rows))


if __name__ == "__main__":
    main()
