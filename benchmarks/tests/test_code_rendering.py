"""The check that copied code reads as code in an answer (``nest_benchmarks.code_rendering``)."""

from __future__ import annotations

from nest_benchmarks.code_rendering import code_lines_read_as_prose
from nest_integrations import NestIndex
from nest_integrations.corpus.passages import Passage

BODY = "   runner = CliRunner()\n   result = runner.invoke(cli)\n   assert result.exit_code == 0"
SOURCE = Passage(id="testing.rst", text=f"Testing\n=======\n\nRun it:\n\n.. code-block:: python\n\n{BODY}\n\nThe result holds the exit code.")


def _answer(text_before: str, text_after: str) -> dict:
    """An output contract that copies :data:`BODY` whole between two pieces the decoder set."""
    start = len(text_before)
    span = {"text": BODY, "start": start, "end": start + len(BODY), "copied": True,
            "source": {"id": SOURCE.id, "chunk_char_start": SOURCE.text.index(BODY)}}
    return {"text": text_before + BODY + text_after, "spans": [span]}


def test_code_copied_without_a_fence_reads_as_prose_and_with_one_as_code(tiny_lm):
    """Three lines of a body indented three spaces: without a fence a Markdown reader shows the
    two it counts (the block's first line is its start, not inside it) as prose; between fences,
    as code. Prose copied around code is no code line."""
    index = NestIndex.build([SOURCE], tiny_lm, show_progress=False)
    assert code_lines_read_as_prose(index, _answer("Run it:\n\n", "")) == (2, 2)
    assert code_lines_read_as_prose(index, _answer("Run it:\n\n```\n", "\n```")) == (2, 0)
    prose = {"text": "The result holds the exit code.", "spans": [
        {"text": "The result holds the exit code.", "start": 0, "end": 31, "copied": True,
         "source": {"id": SOURCE.id, "chunk_char_start": SOURCE.text.index("The result")}}]}
    assert code_lines_read_as_prose(index, prose) == (0, 0)
