"""Corpus sources for ``nest index build``: one document file, or a folder of .txt, .md, .rst and .jsonl files."""

from __future__ import annotations

import json

import pytest

from nest_integrations.corpus.loaders import load_corpus


def test_a_single_markdown_file_is_one_passage(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("# Notes\n\nThe keeper logged every ship.", encoding="utf-8")
    (passage,) = load_corpus(str(path))
    assert (passage.id, passage.title, passage.text) == ("notes.md", "notes", path.read_text(encoding="utf-8"))


def test_a_folder_of_mixed_documents(tmp_path):
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "intro.rst").write_text("Intro text.", encoding="utf-8")
    (tmp_path / "a.txt").write_text("Plain text.", encoding="utf-8")
    (tmp_path / "b.md").write_text("Markdown text.", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "j1", "text": "From JSONL."}) + "\n", encoding="utf-8")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    assert [p.id for p in load_corpus(str(tmp_path))] == ["a.txt", "b.md", "j1", "guide/intro.rst"]


def test_unknown_sources_and_empty_folders_fail_clearly(tmp_path):
    (tmp_path / "data.csv").write_text("a,b", encoding="utf-8")
    with pytest.raises(ValueError, match="unrecognised corpus source"):
        load_corpus(str(tmp_path / "data.csv"))
    with pytest.raises(ValueError, match="no non-empty"):
        load_corpus(str(tmp_path))
