"""What a decoder applies to each of its rows at every step: :class:`Speculation`.

Speculative decoding over a datastore, in three parts that know nothing of each other: the
:class:`~nest_integrations.decoding.mixing.Mixer` (p_M at the fed positions), the
:class:`~nest_integrations.decoding.proposer.SpanProposer` (next token and draft) and the
:class:`~nest_integrations.decoding.verifier.SpanVerifier` (relaxed acceptance, commit, stop
rules). The row scheduler applies a row's own parts (rows of decoders over other datastores
share a batch) and builds its output from the datastore's passages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from nest_integrations.corpus.passages import Passage
from nest_integrations.store.datastore import TokenDatastore
from .mixing import Mixer
from .proposer import SpanProposer
from .verifier import SpanVerifier

__all__ = ["Speculation"]


@dataclass(frozen=True)
class Speculation:
    """One decoder's mixer, proposer and verifier, and the datastore their positions index."""

    mixer: Mixer
    proposer: SpanProposer
    verifier: SpanVerifier
    datastore: Optional[TokenDatastore]

    @property
    def passages(self) -> Sequence[Passage]:
        """The datastore's passages, which token records' passage indices index (none without a datastore)."""
        return self.datastore.passages if self.datastore is not None else []
