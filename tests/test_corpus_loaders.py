"""Corpus sources for ``nest index build``: one document file, or a folder of text documents (maybe gzip-compressed) and .jsonl files."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_compressed_documents_are_read_as_debian_ships_them(tmp_path):
    import gzip

    from nest_integrations.corpus.markdown_structure import is_markdown

    text = "# Usage\n\nRun `tool --help` to list the options.\n"
    (tmp_path / "README.md.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    (tmp_path / "NEWS.txt.gz").write_bytes(gzip.compress(b"Version 2 adds a flag."))
    (tmp_path / "guide.markdown").write_text("Long-form *Markdown*.", encoding="utf-8")
    (tmp_path / "archive.tar.gz").write_bytes(gzip.compress(b"not a document"))
    readme = {p.id: p for p in load_corpus(str(tmp_path))}
    assert sorted(readme) == ["NEWS.txt.gz", "README.md.gz", "guide.markdown"]
    passage = readme["README.md.gz"]
    assert (passage.title, passage.text) == ("README", text)
    assert is_markdown("Plain words only.", passage.metadata)  # named Markdown through the .gz
    (single,) = load_corpus(str(tmp_path / "NEWS.txt.gz"))
    assert single.text == "Version 2 adds a flag."


def test_a_windows_file_reads_as_any_other(tmp_path):
    from nest_integrations.corpus.markdown_structure import section_title

    path = tmp_path / "windows.md"
    path.write_bytes("\ufeff# Setup\r\n\r\nInstall it first.\r\n".encode("utf-8"))  # as a Windows editor saves it
    (passage,) = load_corpus(str(path))
    assert passage.text == "# Setup\n\nInstall it first.\n"
    start, end = section_title(passage.text, passage.text.index("Install"))
    assert passage.text[start:end] == "Setup"  # the title is read as a heading


def test_an_unreadable_document_is_skipped_in_a_folder_and_refused_alone(tmp_path, caplog, monkeypatch):
    import gzip
    import logging

    from nest_integrations.corpus import loaders

    (tmp_path / "good.md").write_text("Readable text.", encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (tmp_path / "broken.md.gz").write_bytes(b"not gzip at all")
    (tmp_path / "huge.txt.gz").write_bytes(gzip.compress(b"x" * 2048))
    (tmp_path / "locked.rst").write_text("Only its owner may read this.", encoding="utf-8")
    monkeypatch.setattr(loaders, "MAX_DECOMPRESSED_BYTES", 1024)
    read_bytes = Path.read_bytes

    def refuse_locked(path):
        if path.name == "locked.rst":
            raise PermissionError(13, "Permission denied")
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refuse_locked)
    with caplog.at_level(logging.WARNING, logger=loaders.__name__):
        assert [p.id for p in load_corpus(str(tmp_path))] == ["good.md"]
    warned = caplog.text
    assert "locked.rst: cannot be read (Permission denied)" in warned
    assert "latin.txt: not UTF-8 text (byte 0xe9 at offset 3)" in warned
    assert "broken.md.gz: not a readable gzip file" in warned and "huge.txt.gz: holds over" in warned
    with pytest.raises(ValueError, match=r"latin\.txt: not UTF-8 text"):
        load_corpus(str(tmp_path / "latin.txt"))
    (tmp_path / "good.md").unlink()
    with pytest.raises(ValueError, match=r"no non-empty .* \(4 unreadable, named in the warnings\)"):
        load_corpus(str(tmp_path))


def test_the_files_a_folder_load_leaves_out_are_counted_by_kind(tmp_path):
    from nest_integrations.corpus.loaders import left_out_files

    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main", encoding="utf-8")
    (tmp_path / ".DS_Store").write_bytes(b"\x00\x00")
    (tmp_path / "api").mkdir()
    for name in ("guide.md", "notes.rst.gz", "c.jsonl", "README", "copyright", "api/a.html", "api/b.HTML", "NEWS.gz"):
        (tmp_path / name).write_text("text", encoding="utf-8")
    assert left_out_files(tmp_path) == {".html": 2, "no suffix": 2, ".gz": 1}
