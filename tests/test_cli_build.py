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
    (docs / "index.html").write_text("<p>The seals.</p>", encoding="utf-8")
    result = CliRunner().invoke(app, ["index", "build", str(docs), "--out", str(tmp_path / "idx"), "--max-tokens", "64"])
    captured = capfd.readouterr()
    assert result.exit_code == 0, result.output
    assert "Left out 1 file of other kinds (1 .html)" in " ".join(result.output.split())
    passages = int(re.search(r"(\d+)\s+passages", result.output).group(1))  # the console wraps long paths
    assert passages > 2  # the long file became several chunks
    noise = result.output + captured.err + captured.out
    assert "DEBUG bm25s" not in noise and "Loading weights" not in noise


def _write_docs(folder):
    folder.mkdir()
    (folder / "lighthouse.txt").write_text(
        "The Brannock lighthouse stands on the northern cape. Its keeper, Ada Morrow, logged every ship that passed "
        "in the long winter of 1893.", encoding="utf-8",
    )
    (folder / "seals.txt").write_text("Grey seals return to the Brannock rocks each spring to breed.", encoding="utf-8")
    (folder / "tides.txt").write_text("The tides at the northern cape rise nine metres twice a day.", encoding="utf-8")


def test_build_with_a_scale_index_then_generate_from_qdrant(tmp_path):
    pytest.importorskip("langchain_qdrant")
    import json

    _write_docs(tmp_path / "docs")
    runner = CliRunner()
    idx, qdrant = tmp_path / "idx", tmp_path / "qdrant"
    refused = runner.invoke(app, ["index", "build", str(tmp_path / "docs"), "--out", str(idx), "--faiss-index", "ivf", "--nlist", "50"])
    assert refused.exit_code == 2 and "nlist must be an integer in [1, 3]" in refused.output.replace("\n", "")
    assert not idx.exists()
    built = runner.invoke(
        app, ["index", "build", str(tmp_path / "docs"), "--out", str(idx), "--lazy-keys", "--faiss-index", "hnsw", "--faiss-on-disk"]
    )
    assert built.exit_code == 0, built.output
    info = runner.invoke(app, ["index", "info", str(idx)])
    assert "HNSW32,Flat (memory-mapped: yes)" in info.output
    exported = runner.invoke(app, ["index", "to-qdrant", str(idx), "--qdrant-path", str(qdrant), "--collection", "cape"])
    assert exported.exit_code == 0 and "Wrote 3 passages" in exported.output
    assert runner.invoke(app, ["generate", "hi", "--qdrant-path", str(qdrant)]).exit_code == 2  # no --collection
    result = runner.invoke(
        app, ["generate", "Who kept the Brannock lighthouse?", "--qdrant-path", str(qdrant), "--collection", "cape",
              "--json", "--max-new-tokens", "24"],
    )
    assert result.exit_code == 0, result.output
    output = json.loads(result.output)
    copied = [s for s in output["spans"] if s["copied"]]
    assert copied, output["text"]
    texts = {json.loads(line)["text"] for line in (idx / "passages.jsonl").read_text().splitlines()}
    for span in copied:
        assert span["source"]["metadata"]["passage_id"]  # a Qdrant point written from the index's passages
        assert any(span["text"] in text for text in texts)
