"""``nest index build`` on a folder of the user's documents: chunked by default, quiet unless -v."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from nest_integrations.cli import app

pytestmark = pytest.mark.slow  # loads the default model


def test_build_from_a_markdown_folder_is_chunked_and_quiet(tmp_path, capfd):
    docs = tmp_path / "docs"
    docs.mkdir()
    sentence = "The keeper logged every ship that passed the northern cape in the long winter. "
    (docs / "keeper.md").write_text("# Keeper\n\n" + sentence * 30, encoding="utf-8")
    (docs / "seals.txt").write_text("The seals return to the rocks each spring.", encoding="utf-8")
    result = CliRunner().invoke(app, ["index", "build", str(docs), "--out", str(tmp_path / "idx"), "--max-tokens", "64"])
    captured = capfd.readouterr()
    assert result.exit_code == 0, result.output
    passages = int(re.search(r"(\d+)\s+passages", result.output).group(1))  # the console wraps long paths
    assert passages > 2  # the long file became several chunks
    noise = result.output + captured.err + captured.out
    assert "DEBUG bm25s" not in noise and "Loading weights" not in noise
