"""What passes between the proposer and the verifier of a row: a :class:`Proposal` and a :class:`Verdict`.

The :class:`~nest_integrations.decoding.proposer.SpanProposer` reads the last :class:`Verdict`
(the mixture at the last accepted position, where a copy goes on) and makes a
:class:`Proposal`; the row scheduler feeds it to the LM, and the
:class:`~nest_integrations.decoding.verifier.SpanVerifier` checks its draft against the mixture
at the fed positions and gives the next :class:`Verdict`. Neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .mixing import Mixture
from .spans import TokenRecord

__all__ = ["Proposal", "Verdict", "WholeEnds"]


@dataclass(frozen=True)
class WholeEnds:
    """Where a copy's draft may stop whole, as draft lengths ``k`` (the copy's token ``k`` is the
    last one kept; 0 keeps the first token alone)."""

    sentences: frozenset[int]
    """Its token ``k`` ends a sentence of the source where the answer stops whole."""
    code: frozenset[int]
    """Its token ``k`` lies in a code block, whose line the rule for copied code then finishes."""

    def within(self, room: int) -> "WholeEnds":
        """Those of at most ``room`` draft tokens."""
        return WholeEnds(frozenset(k for k in self.sentences if k <= room), frozenset(k for k in self.code if k <= room))


@dataclass(frozen=True)
class Proposal:
    """A row's next token and the draft fed after it in the same forward."""

    first: TokenRecord
    """The next token (drawn from p_M, or a copy's first token that passed the relaxed check)."""
    draft: list[TokenRecord] = field(default_factory=list)
    """The rest of a copy, checked against the mixture at each fed position."""
    unchecked: bool = False
    """The draft is accepted whole, without the check: a section title's rest, a planned window
    copied whole, the rest of a copied code line or its block's closing fence."""
    whole_ends: Optional[Callable[[], WholeEnds]] = None
    """Gives where the draft may stop whole; a draft the check accepts only in part is kept to
    one of them (:func:`~nest_integrations.decoding.verifier.whole_prefix`). Called only then:
    reading them is a pass over the draft's tokens that a copy accepted whole never needs.
    None: any accepted prefix is kept."""

    def cut(self, room: int) -> "Proposal":
        """This proposal with at most ``room`` draft tokens (what ``max_new_tokens`` leaves)."""
        ends = self.whole_ends
        within = None if ends is None else (lambda: ends().within(room))
        return Proposal(self.first, self.draft[:room], self.unchecked, within)


@dataclass(frozen=True)
class Verdict:
    """What one forward decided for a row: where its next token's distribution sits and where
    a copy goes on."""

    mixture: Mixture
    """The mixture at the positions fed for the row (one for a prefill)."""
    accepted: int = 0
    """Draft tokens accepted (0 after a prefill): also the position of ``mixture`` that holds the
    next token's distribution, the first rejected one (or the one after the whole draft)."""
    resume_at: Optional[tuple[int, int]] = None
    """``(passage index, position)`` where a copy goes on without a new span selection: after a
    fully accepted draft, or after a copied single token; None after an LM token or a rejected draft."""
