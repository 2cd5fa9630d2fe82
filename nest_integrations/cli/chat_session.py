"""``nest chat``: a conversation with an index in the terminal.

A :class:`ChatSession` holds one decoder (the index and the LM are loaded once)
and the conversation so far, as ``{"role", "content"}`` messages. Each question
is generated with the whole conversation as its prompt, so a follow-up ("And how
do I remove it?") is retrieved together with the earlier questions
(:func:`~nest_integrations.policy.conversation.retrieval_query`) and answered in
context. Each answer is shown with its copied spans highlighted, ``[n]`` after
them and the numbered sources (document, lines, characters) below
(:func:`~nest_integrations.decoding.rendering.render_terminal`).

Lines starting with ``/`` are commands (:data:`COMMANDS`); Ctrl-D (end of
input) or ``/quit`` ends the session, Ctrl-C abandons the answer being
generated (its row leaves the batch) or the line being typed.

The session reads lines from a callable and writes to a rich ``Console``, both
given, so it runs without a terminal in tests; :func:`terminal_reader` is the
interactive reader (prompt_toolkit: line editing, history across sessions).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from nest_integrations.core.config import MODES
from nest_integrations.decoding.output import NestOutput
from nest_integrations.decoding.rendering import render_terminal, source_listing
from nest_integrations.policy.conversation import retrieval_query

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from nest_integrations.decoding.decoder import NestDecoder

logger = logging.getLogger(__name__)

COMMANDS = {
    "/mode MODE": f"answer the next questions in another mode: {', '.join(MODES)} (without MODE: show the current one)",
    "/sources": "the sources of the last answer: document, lines and characters cited",
    "/save FILE": "write the transcript as JSONL, one line per turn with the full output contract (asks before "
    "replacing a file it did not write)",
    "/reset": "forget the conversation (the next question starts a new one)",
    "/help": "this list",
    "/quit": "end the session (or Ctrl-D)",
}
"""The commands a session understands, with their help lines."""


class ChatSession:
    """One conversation with a decoder (see the module docstring).

    Args:
        decoder: the loaded index's decoder (``NestIndex.decoder()``); its config gives
            every setting but ``mode`` and ``max_new_tokens``.
        console: where answers and messages go.
        mode: the first mode (one of :data:`~nest_integrations.core.config.MODES`).
        max_new_tokens: tokens per answer at most.

    Attributes:
        messages: the conversation so far (user questions and the answers' texts).
        turns: one record per answered question, as :meth:`save` writes them.
        last: the last answer, or None.
    """

    def __init__(self, decoder: "NestDecoder", console: "Console", *, mode: str = "nest", max_new_tokens: int = 256):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        self.decoder = decoder
        self.console = console
        self.mode = mode
        self.max_new_tokens = max_new_tokens
        self.messages: list[dict[str, str]] = []
        self.turns: list[dict[str, Any]] = []
        self.last: Optional[NestOutput] = None
        self._read_line: Optional[Callable[[], str]] = None  # asks before /save replaces a file: set by run()
        self._transcripts: set[tuple[int, int, int, int]] = set()  # each file /save wrote, as it left it: its own to replace

    # ------------------------------------------------------------------ the loop
    def run(self, read_line: Callable[[], str]) -> None:
        """Read and handle lines until ``/quit`` or the end of input (``read_line`` raises
        EOFError: Ctrl-D). A KeyboardInterrupt while reading drops the line; while
        answering, it abandons the answer and the conversation stays as it was, as
        it does when the decoder refuses the question (ValueError, shown)."""
        self.console.print("Ask a question; /help lists the commands, Ctrl-D ends.", style="dim", highlight=False)
        self._read_line = read_line
        while True:
            try:
                line = read_line()
            except EOFError:
                break
            except KeyboardInterrupt:
                continue
            try:
                if not self.handle(line):
                    break
            except KeyboardInterrupt:
                self.console.print("(answer abandoned)", style="yellow", highlight=False)
            except ValueError as err:  # a question the decoder refuses (e.g. text that is not valid Unicode)
                self.console.print(f"error: {err}", style="red", highlight=False, markup=False)
        self.console.print("Bye.", style="dim", highlight=False)

    def handle(self, line: str) -> bool:
        """Answer a question or run a command; False when the session should end."""
        text = line.strip()
        if not text:
            return True
        if text.startswith("/"):
            return self.command(text)
        self.ask(text)
        return True

    # ------------------------------------------------------------------ questions
    def ask(self, question: str) -> NestOutput:
        """Answer ``question`` in the conversation so far, show it and remember the turn."""
        messages = [*self.messages, {"role": "user", "content": question}]
        output = self._generate(messages)
        self.messages = [*messages, {"role": "assistant", "content": output.text}]
        self.turns.append(
            {"turn": len(self.turns) + 1, "question": question, "query": retrieval_query(messages), "messages": messages, **output.to_dict()}
        )
        self.last = output
        self._show(output)
        return output

    def _generate(self, messages: list[dict[str, str]]) -> NestOutput:
        """The decoder's output for ``messages``, streamed so that an interrupt (Ctrl-C)
        closes the stream, which takes the row out of the batch at once."""
        chunks = self.decoder.stream(messages, mode=self.mode, max_new_tokens=self.max_new_tokens)
        output = None
        try:
            with self.console.status("answering...", spinner="dots") if self.console.is_terminal else nullcontext():
                for chunk in chunks:
                    output = chunk.output or output
        finally:
            chunks.close()
        assert output is not None  # the last chunk carries the output
        return output

    def _show(self, output: NestOutput) -> None:
        from rich.panel import Panel

        s = output.stats
        self.console.print(Panel(render_terminal(output), title=output.mode, title_align="left"))
        note = (
            f"{output.attribution_ratio:.0%} copied · {s.new_tokens} tokens in {s.wall_s:.2f} s"
            + (f" · {s.finish_reason}" if s.finish_reason else "")
        )
        if s.fallback_reason is not None and output.mode != "base":
            written = "nothing invented" if s.finish_reason == "not_covered" else "the LM wrote alone"
            note += f" · nothing copied ({s.fallback_reason.replace('_', ' ')}): {written}"
        self.console.print(note, style="dim", highlight=False)

    # ------------------------------------------------------------------ commands
    def command(self, text: str) -> bool:
        """Run the command line ``text`` (starting with ``/``); False for ``/quit``."""
        name, _, argument = text.partition(" ")
        argument = argument.strip()
        if name in ("/quit", "/exit"):
            return False
        if name == "/mode":
            self._mode(argument)
        elif name == "/sources":
            self._sources()
        elif name == "/save":
            self._save(argument)
        elif name == "/reset":
            self.messages, self.last = [], None
            self.console.print("New conversation.", style="dim", highlight=False)
        elif name == "/help":
            for usage, description in COMMANDS.items():
                self.console.print(f"  {usage:<12} {description}", highlight=False)
        else:
            self.console.print(f"Unknown command {name}; /help lists the commands.", style="red", highlight=False)
        return True

    def _mode(self, mode: str) -> None:
        if not mode:
            self.console.print(f"Mode: {self.mode}", highlight=False)
        elif mode not in MODES:
            self.console.print(f"Unknown mode {mode!r}; choose from {', '.join(MODES)}.", style="red", highlight=False)
        else:
            self.mode = mode
            self.console.print(f"Mode: {mode}", highlight=False)

    def _sources(self) -> None:
        if self.last is None:
            self.console.print("No answer yet.", highlight=False)
            return
        listing = source_listing(self.last)
        if not listing:
            reason = self.last.stats.fallback_reason
            self.console.print("The last answer copied nothing" + (f" ({reason.replace('_', ' ')})." if reason else "."), highlight=False)
        for line in listing:
            self.console.print(line, highlight=False, markup=False)

    def _save(self, name: str) -> None:
        """``/save FILE``: a file that cannot be written, or that is not a transcript this session wrote
        and the user does not agree to replace, is said so and left as it was; the session and the
        conversation go on either way (/save again with another file)."""
        if not name:
            self.console.print("/save needs a file name: /save transcript.jsonl", style="red", highlight=False)
            return
        try:
            path = Path(name).expanduser()
            if not self._may_replace(path, name):
                self.console.print("Not saved; the conversation is kept: /save another file.", highlight=False, markup=False)
                return
            count = self.save(path)
            status = path.stat()
        except (OSError, RuntimeError, ValueError) as err:  # RuntimeError: ~user without a home; ValueError: a NUL in the name
            reason = str(err.strerror if isinstance(err, OSError) and err.strerror else err).rstrip(".")
            self.console.print(
                f"Could not save to {name}: {reason}. The conversation is kept: /save another file.", style="red", highlight=False, markup=False
            )
            return
        self._transcripts.add(_written(status))
        self.console.print(f"Saved {count} turns to {name}", highlight=False, markup=False)

    def _may_replace(self, path: Path, name: str) -> bool:
        """Whether /save may write ``path``: nothing is there, it is a transcript this session wrote, or the user says so."""
        try:
            status = path.lstat()
        except FileNotFoundError:
            return True
        if _written(status) in self._transcripts:  # unchanged since: the same file, size and time
            return True
        if stat.S_ISDIR(status.st_mode):  # never replaced: no question to ask
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        question = f"{name} exists and is not this conversation's transcript. Replace it? [y/N]"
        if self._read_line is None:  # driven without a reader: no way to ask
            self.console.print(f"{name} exists and is not this conversation's transcript; not replacing it.", style="red", highlight=False, markup=False)
            return False
        self.console.print(question, style="yellow", highlight=False, markup=False)
        try:
            answer = self._read_line()
        except (EOFError, KeyboardInterrupt):
            return False
        return answer.strip().lower() in ("y", "yes")

    def save(self, path: Path) -> int:
        """Write the transcript to ``path`` (replaced whole, atomically) as JSONL: one line per
        answered turn, ``{"turn", "question", "query", "messages", **NestOutput.to_dict()}``
        (``messages``: the prompt the turn was answered from, its question last; ``query``:
        what was retrieved for it). Returns the number of turns."""
        from nest_integrations.core.safe_io import write_file_atomic

        lines = "".join(json.dumps(turn, ensure_ascii=False) + "\n" for turn in self.turns)
        write_file_atomic(path, lines.encode("utf-8"))
        return len(self.turns)


def _written(status: os.stat_result) -> tuple[int, int, int, int]:
    """A file as it is: device, inode, size and modification time (a file rewritten in place differs)."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def terminal_reader(session: ChatSession, history_file: Optional[Path]) -> Callable[[], str]:
    """A prompt_toolkit line reader showing the session's mode (``nest> ``), with line editing
    and the questions of earlier sessions in ``history_file`` (Up/Down, Ctrl-R); None keeps
    the history in memory only (as does a history file that cannot be made private). The file is
    created 0600 (an existing one is set to 0600). Raises EOFError on Ctrl-D, KeyboardInterrupt on Ctrl-C."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    from nest_integrations.core.folder_snapshot import create_private_file

    if history_file is not None:
        try:  # the questions asked are the user's alone: 0600, never written through a link planted there
            history_file.parent.mkdir(parents=True, exist_ok=True)
            create_private_file(history_file)
        except OSError as err:
            logger.warning("keeping the question history in memory only: %s cannot be used (%s)", history_file, err)
            history_file = None
    prompt = PromptSession(history=FileHistory(str(history_file)) if history_file is not None else InMemoryHistory())
    return lambda: prompt.prompt(f"{session.mode}> ")
