"""Where a copied source goes on: the next token of its passage, or the next chunk of its document.

The proposer continues a copy with :func:`continue_at`; the verifier ends an answer at a
source's end when :func:`continue_at` finds nothing after it (``stop_at_source_end``).
``passages`` is the datastore's passage list, which candidate passage indices index.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from nest_integrations.corpus.passages import Passage
from nest_integrations.store.candidates import CandidateSet

__all__ = [
    "READ_BACK_CHUNKS", "continue_at", "cut_between", "cut_width", "first_new_token", "next_chunk", "text_before", "text_read_before",
]

READ_BACK_CHUNKS = 8
"""Chunks of a document read before a passage to know the code block it opens inside
(:func:`text_read_before`). A code block the chunker cut into more chunks than this opens without
its fence (a passage that opens inside it reads as prose); more costs only parsing. On fifteen
indexes (4,354 chunks that go on from another), reading 8 chunks back agrees with reading the
whole document at every chunk, and reading 1 does not at 50 (results/code-blocks-across-chunks)."""


def continue_at(passages: Sequence[Passage], candidates: CandidateSet, pidx: int, pos: int) -> Optional[tuple[int, int]]:
    """Where a copy that reached token ``pos`` of passage ``pidx`` goes on: that token,
    or past a passage's end the first new token of the next chunk of its document
    (:func:`next_chunk`); None when the source ends there."""
    return (pidx, pos) if _has_token(candidates, pidx, pos) else next_chunk(passages, candidates, pidx)


def next_chunk(passages: Sequence[Passage], candidates: CandidateSet, pidx: int) -> Optional[tuple[int, int]]:
    """(passage index, token position) where the chunk after passage ``pidx`` in its
    document starts anew, when that chunk is a candidate.

    Chunks chain by ``doc_id`` and ``doc_char_start`` (the CLI's chunking,
    LangChain's ``add_start_index``, LlamaIndex's ``start_char_idx``;
    :meth:`~nest_integrations.corpus.passages.Passage.continued_by`): the next
    chunk starts after the white space a chunker strips at a cut
    (:func:`cut_between`), or before this one ends when the splitter overlaps
    chunks: its tokens that repeat this chunk's end are skipped.
    """
    here = passages[pidx]
    following = [q for q in candidates.passage_indices if here.continued_by(passages[q])]
    if not following:
        return None
    nxt = min(following, key=lambda q: passages[q].doc_char_start)
    pos = first_new_token(here, passages[nxt], candidates.passage(nxt).char_spans)
    return (nxt, pos) if _has_token(candidates, nxt, pos) else None


def first_new_token(here: Passage, nxt: Passage, char_spans: np.ndarray) -> int:
    """Position of the first token of chunk ``nxt`` (int (L, 2) ``char_spans``) that ends past
    ``here``'s end in their document: where a copy that finished ``here`` goes on, the tokens a
    splitter's overlap repeats skipped; L when none does."""
    return int(np.searchsorted(nxt.doc_char_start + char_spans[:, 1], here.doc_char_end, side="right"))


def cut_between(passages: Sequence[Passage], pidx: int, nxt: int) -> bool:
    """Whether the chunker left characters out between passage ``pidx`` and the chunk ``nxt``
    that goes on from it: the white space of a cut (a line break at least, where a chunk ends
    with a paragraph or a line and the next opens with the following one). A copy that crosses
    it needs a break of its own ("... and to fail in a callback:" and the example's first line
    would run together)."""
    return pidx != nxt and cut_width(passages, pidx, nxt) > 0


def cut_width(passages: Sequence[Passage], pidx: int, nxt: int) -> int:
    """Characters of white space the chunker left out between passage ``pidx`` and the chunk
    ``nxt`` that goes on from it (0 for none, or an overlap): 1 is a line break inside a block
    (a paragraph's next line, a list's next item, a line of code), more a blank line at least."""
    return max(passages[nxt].doc_char_start - passages[pidx].doc_char_end, 0)


def text_before(passages: Sequence[Passage], before: Optional[int], pidx: int) -> str:
    """What a reader of the document read right before passage ``pidx``: the text of chunk
    ``before`` (the one ``pidx`` goes on from,
    :meth:`~nest_integrations.store.datastore.TokenDatastore.preceding_chunk`; None for none)
    up to where ``pidx`` starts, and for the white space a chunker cut between them a line
    break, two for a longer cut (a blank line between paragraphs, or above an indented block;
    the cut's own characters are not kept). "" for a chunk that opens its document."""
    if before is None:
        return ""
    earlier, here = passages[before], passages[pidx]
    if here.doc_char_start <= earlier.doc_char_end:  # a splitter's overlap
        return earlier.text[: here.doc_char_start - earlier.doc_char_start]
    return earlier.text + "\n" * min(cut_width(passages, before, pidx), 2)


def text_read_before(passages: Sequence[Passage], preceding: Callable[[int], Optional[int]], pidx: int, chunks: int = READ_BACK_CHUNKS) -> str:
    """What a reader of the document read in the ``chunks`` chunks before passage ``pidx``
    (:func:`text_before` of each, chained; ``preceding`` gives the chunk a passage goes on from,
    :meth:`~nest_integrations.store.datastore.TokenDatastore.preceding_chunk`): the lead that
    tells in which code block ``pidx`` opens. A long example cut into several chunks has its
    opening fence a few chunks back, and read after the one chunk before, a chunk of its middle
    reads as prose and the example's closing fence as opening a block. "" for a chunk that opens
    its document."""
    lead, here = "", pidx
    for _ in range(chunks):
        before = preceding(here)
        if before is None:
            break
        lead, here = text_before(passages, before, here) + lead, before
    return lead


def _has_token(candidates: CandidateSet, pidx: int, pos: int) -> bool:
    """Whether passage ``pidx`` has a token at position ``pos``."""
    return pos < len(candidates.passage(pidx).token_ids)
