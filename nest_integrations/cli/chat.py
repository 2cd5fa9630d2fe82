"""``nest chat``: a conversation in the terminal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .common import console, fail, load_index

app = typer.Typer()
"""The command of this module, merged into ``nest``."""

@app.command()
def chat(
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    mode: str = typer.Option("nest", help="The first mode (base, rag, knnlm, nest or ra_nest); /mode switches."),
    max_new_tokens: int = typer.Option(256, min=1, help="Tokens per answer at most."),
    model: Optional[str] = typer.Option(None, help="LM to decode with (default: the one that built the index)."),
    history: bool = typer.Option(
        True, "--history/--no-history", help="Keep the questions asked (Up/Down, Ctrl-R) in the cache folder across sessions."
    ),
) -> None:
    """Ask questions in a conversation: follow-ups are retrieved with the earlier questions, answers show
    their copied spans and numbered sources. /help lists the commands (/mode, /sources, /save); Ctrl-D ends."""
    from nest_integrations.core.config import MODES
    from nest_integrations.model.lm import cache_dir

    from .chat_session import ChatSession, terminal_reader

    if mode not in MODES:
        fail(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    if not sys.stdin.isatty():
        fail("nest chat needs a terminal; for questions from a file use nest generate --input")
    decoder = load_index(datastore, model).decoder()
    session = ChatSession(decoder, console, mode=mode, max_new_tokens=max_new_tokens)
    session.run(terminal_reader(session, cache_dir() / "chat_history" if history else None))
