"""The copy plan of one generation: :class:`CopyPlan`, the planned copies an answer makes in turn.

:mod:`~nest_integrations.decoding.prepare` makes the plan before the first step (the answer
windows of a question, or a named subject's passage start); the
:class:`~nest_integrations.decoding.proposer.SpanProposer` takes its openings and copies a planned
window whole, and the :class:`~nest_integrations.decoding.verifier.SpanVerifier` moves from one
planned copy to the next and ends the answer after the last. Positions are ``(passage index, token
position)`` pairs naming datastore entries. Pure state: no LM, no datastore.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

__all__ = ["CopyPlan", "PlannedOpening"]

PlannedOpening = tuple[tuple[int, int], tuple[int, int], bool, bool]
"""``(opening, end, title, runs_on)`` of one planned copy in the decoder's terms: ``(passage
index, first token)``, ``(passage index, last token)`` where copying moves on to the next one or
ends the answer, whether it is a section's title, and whether the copy goes on past ``end``
instead (a window that does not close an answer: :class:`~nest_integrations.decoding.prepare.PlannedCopy`)."""


@dataclass
class CopyPlan:
    """Where an answer's planned copies start and end, and how the model may write between them.

    Empty (the default) for a generation without a plan: nothing opens, nothing ends, the LM
    writes as it likes.
    """

    opening: Optional[tuple[int, int]] = None
    """(passage index, token position) proposed next, once: an answer window's start, or a name's passage start."""
    window_end: Optional[tuple[int, int]] = None
    """(passage index, last token position) of the planned copy being made; copying it ends the
    answer, moves on to the next of ``next_windows``, or lets the copy run on (:attr:`runs_on`).
    None when no planned copy is being made."""
    runs_on: bool = False
    """The planned copy being made goes on past :attr:`window_end`, a copy like any other (the
    LM checks it) to its source's or section's end: its window does not close an answer ("...
    as follows:")."""
    copying_title: bool = False
    """The planned copy that ``opening`` / ``window_end`` describe is a section's title, the label
    of the window after it: its tokens are copied without the LM's check."""
    after_title: bool = False
    """A section's title was just copied and its window opens now: a line break that opens the
    window sets the title on a line of its own and is copied without the LM's check (an LM with
    the passages in its prompt refuses it and writes on in its own words)."""
    next_windows: list[PlannedOpening] = field(default_factory=list)
    """The planned copies still to make, in order."""
    whole: bool = False
    """The answer copies its planned windows whole (``config.check_answer_windows`` off): the model
    writes nothing in it, and a token of its own, once something is copied, ends the answer
    (``answered``). Past the plan (the copy that runs on after a last window that does not close
    an answer, a copy that cannot go on), what a small LM writes is its own, and mostly invented."""
    between_windows: bool = False
    """An LM token now ends the answer (``answered``) instead of the LM writing on: an answer
    window that closes an answer was just copied and the LM refuses the next one's opening."""
    announced: bool = False
    """The copy proposed next goes on where its source does, and its first line is copied without
    the LM's check: a copy that runs on (:attr:`runs_on`) just past its window, which announced
    it ("... with the ``multiple`` flag:") and was chosen for it, or the copy after a paragraph
    break set where a copy goes on past a line of markup or across a chunker's cut, or the line a
    running copy goes on with past markup that ended the line before (a paragraph's ``::``). After a colon
    or a break the LM often refuses the example's first line (``@click.command()``), and the
    answer ended at the announcement. The LM checks the rest, which decides how far it goes on."""

    @classmethod
    def of_copies(cls, planned: Sequence[PlannedOpening], whole: bool) -> "CopyPlan":
        """The plan that makes the copies ``planned`` (at least one) in order; ``whole``: see :attr:`whole`."""
        (opening, window_end, copying_title, runs_on), *rest = planned
        return cls(opening, window_end, runs_on, copying_title, next_windows=list(rest), whole=whole)

    def take_opening(self) -> Optional[tuple[int, int]]:
        """The planned opening, once (None after it was taken, or without one)."""
        opening, self.opening = self.opening, None
        return opening

    def take_announced(self) -> bool:
        """Whether the copy proposed now goes on where its source does (:attr:`announced`), once."""
        announced, self.announced = self.announced, False
        return announced

    def in_planned_copy(self, pidx: int, pos: int) -> bool:
        """Whether token ``pos`` of passage ``pidx`` is at or before the end of the planned copy
        being made, in its passage (:attr:`window_end`)."""
        end = self.window_end
        return end is not None and pidx == end[0] and pos <= end[1]

    def copies_whole(self, pidx: int, pos: int) -> bool:
        """Whether a copy from token ``pos`` of passage ``pidx`` goes on with a window copied
        whole (:attr:`whole`): without the LM's check, repeats and all."""
        return self.whole and self.in_planned_copy(pidx, pos)

    def ends_at(self, pidx: int, pos: int) -> bool:
        """Whether token ``pos`` of passage ``pidx`` is the last of the planned copy being made."""
        return self.window_end == (pidx, pos)

    def next_copy(self) -> bool:
        """The planned copy :attr:`window_end` names is done: move on to the next one, or let it
        run on (:attr:`runs_on`: no planned copy is made from here). False when none is left
        and it does not run on (the answer is done)."""
        if self.runs_on:
            self.window_end, self.runs_on, self.announced = None, False, True
            return True
        if not self.next_windows:
            return False
        self.between_windows = not self.copying_title  # a title is followed by its window, whatever the LM says
        self.after_title, self.announced = self.copying_title, False
        (self.opening, self.window_end, self.copying_title, self.runs_on), *self.next_windows = self.next_windows
        return True

    def end_with(self, pidx: int, last: int) -> None:
        """Replace what is left of the plan by one copy that ends the answer at token ``last`` of
        passage ``pidx`` (a copied code block's closing fence)."""
        self.window_end, self.next_windows, self.copying_title, self.runs_on = (pidx, last), [], False, False

    def refuses_lm_token(self, started: bool) -> bool:
        """Whether a token the LM writes now ends the answer: the LM refused the next window's
        opening, or would write in a planned answer copied whole (``started``: the answer holds
        a token already)."""
        return self.between_windows or (self.whole and started)
