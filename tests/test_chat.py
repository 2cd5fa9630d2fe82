"""``nest chat``: one conversation over an index loaded once; follow-ups retrieved with the earlier
questions, answers with their sources, /mode, /sources, /save (JSONL with the output contract),
Ctrl-D. The session is driven directly, then as a user drives it, through a pseudo-terminal."""

from __future__ import annotations

import io
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ListRetriever
from rich.console import Console

from nest_integrations.cli.chat_session import ChatSession
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.decoding.output import NestOutput

FIRST = "Who was Marie Curie?"
FOLLOW_UP = "Where was she born?"
CONTRACT = set(NestOutput.model_fields)


class Recording(ListRetriever):
    """The small passages for any query; the queries are kept."""

    def __init__(self, passages):
        super().__init__(passages)
        self.queries = []

    def retrieve(self, query, k):
        self.queries.append(query)
        return super().retrieve(query, k)


@pytest.fixture
def session(tiny_lm, tiny_datastore, small_passages):
    decoder = NestDecoder(tiny_lm, tiny_datastore, Recording(small_passages))
    decoder.config = decoder.config.updated(alpha=5.0, delta=1.0, gamma=1e-6)
    return ChatSession(decoder, Console(file=io.StringIO(), width=120, color_system=None), max_new_tokens=6)


def printed(session):
    return session.console.file.getvalue()


def reader(lines):
    """A line reader typing ``lines`` one by one, then Ctrl-D (EOFError)."""
    pending = iter(lines)

    def read():
        try:
            return next(pending)
        except StopIteration:
            raise EOFError from None

    return read


def test_a_follow_up_is_retrieved_and_answered_with_the_conversation(session):
    first = session.ask(FIRST)
    session.ask(FOLLOW_UP)
    assert session.decoder.retriever.queries == [FIRST, f"{FIRST}\n{FOLLOW_UP}"]
    assert session.messages == [
        {"role": "user", "content": FIRST}, {"role": "assistant", "content": first.text},
        {"role": "user", "content": FOLLOW_UP}, {"role": "assistant", "content": session.last.text},
    ]
    assert session.turns[1]["messages"] == session.messages[:3] and session.turns[1]["query"] == f"{FIRST}\n{FOLLOW_UP}"


def test_answers_show_their_copied_spans_and_sources_and_commands_answer(session, tmp_path):
    session.run(reader([FIRST, "/sources", "/mode", "/mode fast", "/mode rag", FOLLOW_UP, "/nope", "/help", f"/save {tmp_path / 't.jsonl'}"]))
    out = printed(session)
    copied = [s for s in session.turns[0]["spans"] if s["copied"]]
    assert copied, "the tiny LM with these settings copies"
    assert len(re.findall(r"\[1\] \w+ \(.*\): lines? [\d-]+, chars \d+-\d+", out)) >= 2  # under the answer, again for /sources
    assert "Mode: nest" in out and "Unknown mode 'fast'" in out and "Mode: rag" in out
    assert "Unknown command /nope" in out and "/save FILE" in out and out.rstrip().endswith("Bye.")
    assert [t["mode"] for t in session.turns] == ["nest", "rag"]
    saved = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(saved) == 2 and all(CONTRACT <= set(turn) for turn in saved)
    assert saved[1]["question"] == FOLLOW_UP and saved[1]["messages"][0]["content"] == FIRST


def test_a_refused_question_is_shown_and_the_session_goes_on(session):
    session.run(reader(["bad \ud800 text", FIRST]))
    assert "error: " in printed(session) and "lone surrogate" in printed(session)
    assert [t["question"] for t in session.turns] == [FIRST] and session.messages[0]["content"] == FIRST


def test_sources_and_save_before_any_answer(session, tmp_path):
    assert session.handle("/sources") and "No answer yet." in printed(session)
    assert session.handle("/save") and "/save needs a file name" in printed(session)
    assert session.handle(f"/save {tmp_path / 'missing' / 'x.jsonl'}") and "Could not save" in printed(session)
    assert not session.handle("/quit")


def test_a_bad_save_path_never_ends_the_session_nor_loses_the_conversation(session, tmp_path):
    session.run(reader([FIRST, "/save ~nosuchuser-of-this-machine/t.jsonl", f"/save {tmp_path}", "/save bad\x00name", FOLLOW_UP, f"/save {tmp_path / 't.jsonl'}"]))
    out = " ".join(printed(session).split())
    assert out.count("Could not save to") == 3 and out.count("The conversation is kept") == 3, out
    assert out.rstrip().endswith("Bye.") and "Saved 2 turns" in out
    saved = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [turn["question"] for turn in saved] == [FIRST, FOLLOW_UP]


def test_save_asks_before_replacing_a_file_that_is_not_its_own_transcript(session, tmp_path):
    notes, transcript = tmp_path / "notes.txt", tmp_path / "t.jsonl"
    notes.write_text("my notes")
    session.run(reader([FIRST, f"/save {notes}", "n", f"/save {transcript}", FOLLOW_UP, f"/save {transcript}"]))
    out = " ".join(printed(session).split())
    assert notes.read_text() == "my notes" and "notes.txt exists and is not this conversation's transcript" in out
    assert "Not saved; the conversation is kept" in out
    assert out.count("Replace it?") == 1, "its own transcript is replaced without asking"
    assert len(transcript.read_text(encoding="utf-8").splitlines()) == 2

    transcript.write_text("written by something else")  # no longer the file this session wrote
    session.run(reader([f"/save {transcript}", "", f"/save {notes}", "yes"]))
    assert transcript.read_text() == "written by something else", "Enter alone answers no"
    assert len(notes.read_text(encoding="utf-8").splitlines()) == 2, "replaced once the user said yes"
    unasked = ChatSession(session.decoder, session.console)  # driven without a reader: nothing to ask with
    assert unasked.handle(f"/save {transcript}") and transcript.read_text() == "written by something else"
    assert "not replacing it" in printed(session)


def test_the_question_history_is_private_and_never_written_through_a_link(session, tmp_path):
    import os
    import stat

    from nest_integrations.cli.chat_session import terminal_reader

    history = tmp_path / "cache" / "chat_history"
    terminal_reader(session, history)
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    history.chmod(0o644)  # written by an older release
    terminal_reader(session, history)
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    history.unlink()
    (tmp_path / "elsewhere").write_text("someone's file")
    os.symlink(tmp_path / "elsewhere", history)
    terminal_reader(session, history)  # history kept in memory instead
    assert (tmp_path / "elsewhere").read_text() == "someone's file" and stat.S_IMODE((tmp_path / "elsewhere").stat().st_mode) != 0o600


# --------------------------------------------------------------------------- through a pseudo-terminal
LAUNCHER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from transformers import AutoTokenizer
    from conftest import make_tiny_lm
    from nest_integrations.model import lm
    tiny = make_tiny_lm(AutoTokenizer.from_pretrained(lm.default_model_path()))
    lm.load_lm = lambda *args, **kwargs: tiny
    os.environ["NEST_CACHE_DIR"] = {cache!r}  # the question history goes there
    from nest_integrations.cli import app
    app(["chat", "-d", {index!r}, "--model", "tiny", "--max-new-tokens", "8"], prog_name="nest")
    """
)


def test_nest_chat_in_a_terminal(monkeypatch, tiny_lm, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    from typer.testing import CliRunner

    from nest_integrations.cli import app

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "curie.md").write_text(
        "# Marie Curie\n\nMarie Curie was a Polish physicist and chemist.\nShe was born in 1867 in Warsaw.\n", encoding="utf-8"
    )
    (docs / "turing.md").write_text("# Alan Turing\n\nAlan Turing was an English mathematician born in 1912.\n", encoding="utf-8")
    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    built = CliRunner().invoke(app, ["index", "build", str(docs), "--out", str(tmp_path / "idx"), "--retriever", "bm25"])
    assert built.exit_code == 0, built.output

    launcher = LAUNCHER.format(tests=str(Path(__file__).parent), cache=str(tmp_path / "cache"), index=str(tmp_path / "idx"))
    env = {**__import__("os").environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    child = pexpect.spawn(sys.executable, ["-c", launcher], env=env, encoding="utf-8", timeout=40, dimensions=(40, 120))
    transcript = tmp_path / "chat.jsonl"
    try:
        child.expect_exact("nest>", timeout=50)  # the index and the LM load once, here
        for question in (FIRST, FOLLOW_UP):
            child.sendline(question)
            child.expect(r"tokens in [\d.]+ s")
            child.expect_exact("nest>")
        child.sendline("/mode rag")
        child.expect_exact("rag>")
        child.sendline(FOLLOW_UP)
        child.expect(r"tokens in [\d.]+ s")
        child.expect_exact("rag>")
        child.sendline(f"/save {transcript}")
        child.expect("Saved 3 turns")
        child.expect_exact("rag>")
        child.sendcontrol("d")
        child.expect_exact("Bye.")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    turns = [json.loads(line) for line in transcript.read_text(encoding="utf-8").splitlines()]
    assert [(t["turn"], t["mode"], t["question"]) for t in turns] == [(1, "nest", FIRST), (2, "nest", FOLLOW_UP), (3, "rag", FOLLOW_UP)]
    assert all(CONTRACT <= set(t) for t in turns)
    assert turns[1]["query"] == f"{FIRST}\n{FOLLOW_UP}"  # the follow-up was retrieved with the first question
    assert [m["role"] for m in turns[2]["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    history = (tmp_path / "cache" / "chat_history").read_text(encoding="utf-8")
    assert FIRST in history and "/mode rag" in history
    assert (tmp_path / "cache" / "chat_history").stat().st_mode & 0o777 == 0o600


def test_nest_chat_refuses_a_bad_mode_and_a_stdin_that_is_not_a_terminal_before_loading(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from nest_integrations.cli import app
    from nest_integrations.index.nest_index import NestIndex

    def work(*args, **kwargs):
        raise AssertionError("loaded an index")

    monkeypatch.setattr(NestIndex, "load", work)
    bad = CliRunner().invoke(app, ["chat", "-d", str(tmp_path), "--mode", "fast"])
    assert bad.exit_code == 2 and "unknown mode 'fast'" in bad.output
    piped = CliRunner().invoke(app, ["chat", "-d", str(tmp_path)], input="Who?\n")
    assert piped.exit_code == 2 and "nest chat needs a terminal" in " ".join(piped.output.split())
